"""`pretrain-cli export` (training/export.py): a checkpoint of per-rank pieces or a final directory → a Hugging
Face directory in the dtype asked for, sharded above the size limit, published whole; a damaged one refused in
one line. The TP2 x PP2 case against transformers: tests/distributed/test_tp_pipeline.py."""
import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from pretrain_cli import runtime
from pretrain_cli.cli import main
from pretrain_cli.run_layout import ParallelConfig

PRESET = Path(__file__).resolve().parents[2] / "src/pretrain_cli/config/presets/micro-llama"


def _model():
    paddle = runtime.import_paddle()
    from pretrain_cli.models import build_model
    from pretrain_cli.models.config import ModelConfig

    paddle.seed(0)
    return build_model(ModelConfig.from_file(str(PRESET)))


def _two_rank_checkpoint(root: Path, model) -> Path:
    """checkpoint-4 as two data-parallel ranks write it (each its share of the tensors, one index)."""
    paddle = runtime.import_paddle()
    from pretrain_cli.distributed.comms.comm import NoComm
    from pretrain_cli.distributed.strategies.strategy import Strategy
    from pretrain_cli.models.config import ModelConfig
    from pretrain_cli.training import checkpoint

    opt = paddle.optimizer.AdamW(learning_rate=1e-3, parameters=model.parameters())
    opt._create_accumulators(paddle.static.default_main_program().global_block(), list(model.parameters()))
    for rank in (1, 0):
        strategy = Strategy(ParallelConfig(world_size=2, rank=rank, dp_degree=2))
        saver = checkpoint.Saver(root, ModelConfig.from_file(str(PRESET)), NoComm(), {}, None, "float32", None,
                                 rank=rank, world_size=2, layout=strategy.name)
        saver(4, strategy.pieces(model, opt), {"global_step": 4, "consumed_samples": 0} if rank == 0 else None)
    return root / "checkpoint-4"


def test_cast_rounds_as_paddle_does():
    """bf16 to nearest even (ties, inf, the largest values) and fp16, as Paddle's own cast gives them."""
    paddle = runtime.import_paddle()
    from pretrain_cli.storage.shard_files import cast

    x = np.random.default_rng(0).standard_normal(4096).astype(np.float32) * 100
    edges = np.array([1.0 + 2**-8, 1.0 + 3 * 2**-8, -0.0, np.inf, -np.inf, np.nan, 3.4e38, 1e-40], np.float32)
    x = np.concatenate([x, edges])
    bf16 = cast(x, "F32", "BF16")
    assert bf16.dtype == np.uint16
    finite = ~np.isnan(x)  # NaN stays NaN (Paddle keeps its payload's top bits, torch and this the quiet NaN)
    assert np.array_equal(bf16[finite], paddle.to_tensor(x).astype("bfloat16").numpy()[finite])
    assert np.array_equal(cast(bf16, "BF16", "F32"), paddle.to_tensor(x).astype("bfloat16").astype("float32").numpy(),
                          equal_nan=True)
    with np.errstate(over="ignore"):
        assert np.array_equal(cast(x, "F32", "F16"), x.astype(np.float16), equal_nan=True)


def test_a_checkpoint_of_pieces_exports_sharded_in_bf16(tmp_path):
    model = _model()
    ckpt = _two_rank_checkpoint(tmp_path / "run", model)
    out = tmp_path / "hf"
    assert main(["export", str(ckpt), str(out), "--dtype", "bfloat16", "--max_shard_size_gib", "0.0001"]) == 0
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(files) > 1 and set(index["weight_map"].values()) == set(files)
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    from pretrain_cli.storage.shard_files import File

    got = {}
    for f in files:  # bf16 read as its uint16 bits (numpy has no bfloat16)
        shard = File(out / f)
        got.update({n: shard.read(n) for n in shard.tensors})
    from pretrain_cli.models.convert import hf_params

    for name, p, transpose in hf_params(model):
        want = p.astype("bfloat16").numpy()
        assert np.array_equal(got[name], want.T if transpose else want), name
    assert not (tmp_path / "hf.tmp").exists()


def test_a_damaged_checkpoint_is_refused_in_one_line(tmp_path, capsys):
    ckpt = _two_rank_checkpoint(tmp_path / "run", _model())
    f = ckpt / "model-00002-of-00002.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 1
    f.write_bytes(bytes(data))
    assert main(["export", str(ckpt), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot export" in err and "does not match its checksum" in err, err
    assert not (tmp_path / "hf").exists() and not (tmp_path / "hf.tmp").exists()


def test_a_mistyped_checkpoint_is_said_missing_with_the_ones_its_run_holds(tmp_path, capsys):
    """export run/checkpoint-40 where the run saved checkpoint-4: it said "is not a directory", as if a file stood
    there; now it is missing, and the line names the checkpoints beside it."""
    _two_rank_checkpoint(tmp_path / "run", _model())
    assert main(["export", str(tmp_path / "run" / "checkpoint-40"), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "checkpoint-40 does not exist" in err, err
    assert err.rstrip().endswith(f"{tmp_path / 'run'} holds checkpoint-4"), err
    (tmp_path / "file").write_text("x")
    assert main(["export", str(tmp_path / "file"), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert "file is not a directory; export another checkpoint-N (or the final directory)\n" in err, err
    assert not (tmp_path / "hf").exists()


def test_a_damaged_optimizer_state_does_not_stop_an_export(tmp_path, capsys):
    """An export reads the weights only: its damaged optimizer state is a resume's problem, not the export's."""
    ckpt = _two_rank_checkpoint(tmp_path / "run", _model())
    optimizer = sorted(ckpt.glob("optimizer*.safetensors"))
    assert optimizer
    data = bytearray(optimizer[0].read_bytes())
    data[-1] ^= 1
    optimizer[0].write_bytes(bytes(data))
    from pretrain_cli.storage import intact

    assert "does not match its checksum" in intact.problem(ckpt)  # a resume refuses it
    assert main(["export", str(ckpt), str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf" / "model.safetensors").is_file()


def test_a_final_directory_exports_and_a_truncated_one_is_refused(tmp_path, capsys):
    from pretrain_cli.models.config import ModelConfig
    from pretrain_cli.models.convert import save_hf

    model = _model()
    final = tmp_path / "final"
    save_hf(model, ModelConfig.from_file(str(PRESET)), str(final))
    assert main(["export", str(final), str(tmp_path / "a"), "--dtype", "float16"]) == 0
    got = load_file(str(tmp_path / "a" / "model.safetensors"))
    assert got["model.norm.weight"].dtype == np.float16 and len(got) == len(list(model.parameters()))
    assert main(["export", str(final), str(tmp_path / "a")]) == 2  # never over a directory that holds files
    weights = final / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8])
    assert main(["export", str(final), str(tmp_path / "b")]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert "exists and is not empty" in lines[-2] and "is truncated" in lines[-1], lines


def test_deepseeks_router_stays_fp32_in_a_bf16_export(tmp_path):
    """transformers keeps DeepSeek-V3's `mlp.gate.weight` and `e_score_correction_bias` in fp32 in every dtype
    (`_keep_in_fp32_modules_strict`); rounded to bf16 they would choose other experts. Everything else is bf16."""
    paddle = runtime.import_paddle()
    from pretrain_cli.models import build_model
    from pretrain_cli.models.config import ModelConfig
    from pretrain_cli.models.convert import hf_params, save_hf
    from pretrain_cli.storage.shard_files import File

    paddle.seed(0)
    cfg = ModelConfig.from_file(str(PRESET.parent / "micro-deepseek-v3"))
    model = build_model(cfg)
    save_hf(model, cfg, str(tmp_path), dtype="bfloat16")
    shard = File(tmp_path / "model.safetensors")
    kept = {n for n in shard.tensors if n.endswith(("mlp.gate.weight", "mlp.gate.e_score_correction_bias"))}
    assert kept and all(shard.tensors[n]["dtype"] == "F32" for n in kept)
    assert {shard.tensors[n]["dtype"] for n in shard.tensors if n not in kept} == {"BF16"}
    params = {name: (p, tr) for name, p, tr in hf_params(model)}
    for n in kept:
        p, tr = params[n]
        assert np.array_equal(shard.read(n), p.numpy().T if tr else p.numpy()), n  # exact, not rounded
    from pretrain_cli.models.convert import export_dtype

    v2 = ModelConfig.from_file(str(PRESET.parent / "deepseek-v2-lite"))  # transformers keeps V2's router weight fp32
    assert export_dtype("model.layers.1.mlp.gate.weight", v2, "bfloat16") == "float32"
    assert export_dtype("model.layers.1.mlp.experts.0.gate_proj.weight", v2, "bfloat16") == "bfloat16"


@pytest.mark.parametrize("size", ["nan", "inf", "1e-12", "0", "-1"])
def test_a_shard_size_that_is_no_size_is_one_line(tmp_path, capsys, size):
    """nan and inf printed a traceback; 1e-12 rounded to 0 bytes and exported unsharded."""
    ckpt = _two_rank_checkpoint(tmp_path / "run", _model())
    assert main(["export", str(ckpt), str(tmp_path / "hf"), "--max_shard_size_gib", size]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--max_shard_size_gib: must be a number of GiB" in err, err
    assert not (tmp_path / "hf").exists()


def test_a_trained_routing_bias_left_out_of_a_qwen_moe_export_is_said(tmp_path, capsys):
    """transformers' Qwen3-MoE has no routing bias, so the export leaves it out; one the run trained made other
    experts win, so the exported model's outputs differ from the checkpoint's: it did so without a word."""
    paddle = runtime.import_paddle()
    from pretrain_cli.distributed.comms.comm import NoComm
    from pretrain_cli.distributed.strategies.strategy import Strategy
    from pretrain_cli.models import build_model
    from pretrain_cli.models.config import ModelConfig
    from pretrain_cli.run_config import MoeConfig
    from pretrain_cli.training import checkpoint

    cfg = ModelConfig.from_file(str(PRESET.parent / "micro-qwen3-moe"))
    paddle.seed(0)
    model = build_model(cfg, None, MoeConfig(routing_bias=True))
    biases = [p for n, p in model.named_parameters() if n.endswith("e_score_correction_bias")]
    opt = paddle.optimizer.AdamW(learning_rate=1e-3, parameters=model.parameters())
    strategy = Strategy(ParallelConfig(world_size=1, rank=0, dp_degree=1))
    for step, value in ((1, 0.0), (2, 0.03)):  # balancing off (zeros: exact without it), then a trained bias
        for b in biases:
            b.set_value(paddle.full(b.shape, value) * paddle.to_tensor([1.0, -1.0] * (b.shape[0] // 2)))
        saver = checkpoint.Saver(tmp_path / "run", cfg, NoComm(), {}, None, "float32", None, rank=0, world_size=1,
                                 layout=strategy.name)
        saver(step, strategy.pieces(model, opt), {"global_step": step, "consumed_samples": 0})
    assert biases and main(["export", str(tmp_path / "run" / "checkpoint-1"), str(tmp_path / "zero")]) == 0
    assert "routing bias" not in capsys.readouterr().err
    assert main(["export", str(tmp_path / "run" / "checkpoint-2"), str(tmp_path / "trained")]) == 0
    err = capsys.readouterr().err
    assert ("note: the routing bias the run trained (moe_router_bias_update_rate; largest |bias| 0.03) is not "
            "exported: transformers' Qwen3MoeForCausalLM has none") in err
    assert not any(n.endswith("e_score_correction_bias") for n in load_file(str(tmp_path / "trained" / "model.safetensors")))
