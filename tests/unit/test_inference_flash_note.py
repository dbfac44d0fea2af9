"""`eval` and `generate` judge flash attention's head-width rule (`config.compute.flash_width`) on the model they run,
as `train` does: review R10 of 202226f7 / ed329682. Where the width turned the run to the math path nothing said why
(the note was built and dropped, and the kernels' own warning never fires on the math path); the mask judged was a
copy of `config.resolve`'s reading of the run's data keys, not the one `eval --attention_mask_type` runs; and the fix
at a width no GPU takes said "at most 192" on an H100, which runs 256."""
import json
from types import SimpleNamespace

from pretrain_cli.config import compute
from pretrain_cli.config.parser import parse_config
from pretrain_cli.config.presets import PRESET_DIR
from pretrain_cli.models.config import ModelConfig
from pretrain_cli.ops import flash_width
from pretrain_cli.orchestration import targets
from pretrain_cli.run_config import KernelConfig, Target

L40S = Target("gpu", gpu_name="NVIDIA L40S", gpu_capability=(8, 9))
H100 = Target("gpu", gpu_name="NVIDIA H100 80GB HBM3", gpu_capability=(9, 0))
NOTE_12 = ("note: use_flash_attention: flash attention refuses head width 12 on NVIDIA L40S (flash-attn takes "
           "multiples of 8 up to 256): the run materialises the scores; for flash attention max(qk_nope_head_dim + "
           "qk_rope_head_dim, v_head_dim) must be a multiple of 8 of at most 256\n")


def _model(name: str, **kw) -> ModelConfig:
    return ModelConfig.from_dict({**json.loads((PRESET_DIR / name / "config.json").read_text()), **kw})


def _bf16():
    return parse_config(None, ["--use_flash_attention", "true", "--bf16", "true"])


def test_eval_and_generate_print_why_the_width_turns_flash_attention_away(monkeypatch, capsys):
    """At the parity micro MLA's width 12 on a GPU: the math path, and its note on stderr (train prints it at
    start-up); the precision rules' other notes stay `recorded.idle_kernel_keys`' to say. `eval --config`'s run
    (resolved as train's) prints its own width note the same way."""
    monkeypatch.setattr(targets, "inference_target", lambda: L40S)
    narrow = _model("micro-deepseek-v3", qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, kv_lora_rank=12)
    kernels, device = targets.inference_kernels(arguments=_bf16(), model_cfg=narrow)
    assert (kernels.attention, device) == ("math", "gpu")
    assert capsys.readouterr().err == NOTE_12
    targets.inference_kernels(arguments=_bf16(), model_cfg=_model("micro-deepseek-v3"))  # 192: flash, nothing said
    assert capsys.readouterr().err == ""
    run = SimpleNamespace(kernels=KernelConfig(attention="math"), device="gpu",
                          notes=("precision: something else", NOTE_12[len("note: "):-1]))
    assert targets.inference_kernels(run)[0].attention == "math"
    assert capsys.readouterr().err == NOTE_12


def test_the_mask_judged_is_the_one_the_command_runs(monkeypatch):
    """Width 264 (head_dim, a multiple of 8 over 256): causal keeps flash's memory (sdpa's memory-efficient kernel),
    a document mask (flashmask, no such kernel) materialises. The mask is the caller's, not the run's data keys:
    `eval --attention_mask_type document` of a model no run wrote was judged causal."""
    wide = _model("micro-llama", hidden_size=4 * 264, num_attention_heads=4, num_key_value_heads=4)
    monkeypatch.setattr(targets, "inference_target", lambda: H100)
    assert targets.inference_kernels(arguments=_bf16(), model_cfg=wide)[0].attention == "flash"
    assert targets.inference_kernels(arguments=_bf16(), model_cfg=wide, mask="document")[0].attention == "math"
    record = parse_config(None, ["--use_flash_attention", "true", "--bf16", "true", "--attention_mask_type",
                                 "document"])  # a run's record: generate runs causal all the same
    assert compute.kernels_for(record, H100, [], model_cfg=wide).attention == "flash"


def test_eval_hands_the_mask_its_windows_run_with_to_the_kernel_choice(tmp_path, capsys, monkeypatch):
    from test_inference_kernels import _run, _snapshot
    from data_helpers import write_tokens

    seen = []
    real = targets.inference_kernels

    def recording(*a, **kw):
        seen.append(kw.get("mask"))
        return real(*a, **kw)

    monkeypatch.setattr(targets, "inference_kernels", recording)
    model = _snapshot(tmp_path)
    prefix = write_tokens(tmp_path / "c", n_docs=8, doc_len=64, vocab_size=320)
    _run(capsys, "eval", "--model", model, "--data", prefix, "--max_seq_length", "96", "--attention_mask_type",
         "document", "--json")
    assert seen == ["document"]


def test_the_fix_at_a_width_no_gpu_takes_names_the_bound_of_the_gpu_named():
    """256 where it runs (compute capability 8.0 / 9.0, or a forward alone), 192 elsewhere with where 256 runs."""
    keys = "for flash attention head_dim must be a multiple of 8 of at most"
    assert flash_width.fix("", False, (9, 0)) == f"{keys} 256"
    assert flash_width.fix("", False, (8, 9), backward=False) == f"{keys} 256"
    assert flash_width.fix("", False, (8, 9)) == f"{keys} 192 (256 on compute capability 8.0 / 9.0)"
    assert flash_width.fix("", False) == f"{keys} 192 (256 on compute capability 8.0 / 9.0)"
    assert flash_width.fix("compute capability 8.9", False, (8, 9)) == \
        f"{keys} 192, or run on a GPU of compute capability 8.0 / 9.0 (A100, H100)"


def test_eval_config_judges_the_width_as_a_forward_on_the_model_it_loads():
    """`eval --config` ran `train`'s judgement (with a backward) on the config's model: width 200 on an L40S took
    the math path and printed train's note, while `eval --model` of the same run ran flash-attn (review R16 of
    f346fc85, item 1). `compute.forward_kernels` judges a forward alone, on the model eval loads."""
    from pretrain_cli.config.resolve import resolve

    wide = _model("micro-deepseek-v3", qk_nope_head_dim=136, qk_rope_head_dim=64)
    args = parse_config(None, ["--output_dir", "o", "--input_dir", "d", "--do_train", "--max_steps", "5",
                               "--device", "gpu", "--bf16", "true", "--use_flash_attention", "true"])
    run = resolve(args, wide, L40S)
    assert run.kernels.attention == "math" and any(n.startswith(compute.WIDTH_NOTE) for n in run.notes)
    evaluated = compute.forward_kernels(run, args, wide, L40S)
    assert evaluated.kernels.attention == "flash"
    assert not any(n.startswith(compute.WIDTH_NOTE) for n in evaluated.notes)
    narrow = _model("micro-deepseek-v3", qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, kv_lora_rank=12)
    loaded = compute.forward_kernels(resolve(args, _model("micro-deepseek-v3"), L40S), args, narrow, L40S)
    assert loaded.kernels.attention == "math"
    assert [f"note: {n}\n" for n in loaded.notes if n.startswith(compute.WIDTH_NOTE)] == [NOTE_12]


def test_eval_config_builds_the_model_it_loads_with_the_forwards_kernels(tmp_path, capsys, monkeypatch):
    """`eval --config` hands `forward_kernels`' run (judged on the model it loads, not the config's) to the model it
    builds: it built `train`'s resolved run as it was."""
    from pretrain_cli.cli import main as cli_main
    from pretrain_cli.training import weight_source
    from test_inference_kernels import _fp16_run

    monkeypatch.setattr(targets, "inference_target", lambda: L40S)
    judged, asked, real, load = [], [], compute.forward_kernels, weight_source.load_for_inference
    monkeypatch.setattr(compute, "forward_kernels", lambda run, args, cfg, target: judged.append(
        (cfg, target, real(run, args, cfg, target))) or judged[-1][2])
    monkeypatch.setattr(weight_source, "load_for_inference", lambda model_dir, cfg, seed, request=None, device=None:
                        asked.append((cfg, request, device)) or load(model_dir, cfg, seed))
    _, config, _ = _fp16_run(tmp_path, "bf16")
    code, err = cli_main(["eval", "--config", config, "--use_flash_attention", "true", "--json"]), capsys.readouterr()
    assert code == 0, err
    (cfg, target, run), = judged
    assert asked == [(cfg, run.kernels, "gpu")] and target == L40S and run.kernels.attention == "flash"
