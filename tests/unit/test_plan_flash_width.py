"""`plan` and the resolved run know where flash attention will not run on the GPU: flash-attn refuses a head width
not a multiple of 8 up to 256 on every GPU, and one above 192 off compute capability 8.0 / 9.0 (its backward:
`ops.flash_width`), where the attention paths materialise the scores at run time (`ops.gpu_attention.gpu_path`).
The plan counted flash's memory there all the same and its `kernels:` words named flash-attn; now `config.resolve`
turns such a run to the materialised path with one line, for the GPU planned (the table's compute capability:
`planning.hardware.CAPABILITY`) or the one `train` runs on (the driver's). The width is MLA's padded one,
max(qk_head_dim, v_head_dim) (`models.mla`)."""
import json

import pytest

from plan_helpers import plan
from pretrain_cli.config import compute
from pretrain_cli.config.parser import parse_config
from pretrain_cli.config.presets import PRESET_DIR
from pretrain_cli.config.resolve import resolve
from pretrain_cli.models.config import ModelConfig
from pretrain_cli.ops import flash_width
from pretrain_cli.planning import hardware
from pretrain_cli.run_config import Target

MLA_FIX = ("for flash attention max(qk_nope_head_dim + qk_rope_head_dim, v_head_dim) must be a multiple of 8 of at "
           "most 192")
GPU_FIX = f"{MLA_FIX}, or run on a GPU of compute capability 8.0 / 9.0 (A100, H100)"
MLA_FIX_256 = f"{MLA_FIX[:-len('192')]}256"  # a width no GPU takes, on a GPU taking 256 (H100; a forward alone)
NOTE = ("use_flash_attention: flash attention refuses head width 200 on L40S (compute capability 8.9; flash-attn's "
        f"backward above 192 runs on 8.0 and 9.0 only): planned with the scores materialised; {GPU_FIX}")
# an MLA of query/key width 136 + 64 = 200 (value 16, padded to 200), and one whose value heads are the wider
WIDE_QK = {"qk_nope_head_dim": 136, "qk_rope_head_dim": 64}
WIDE_V = {"qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 200}


def _preset(name: str, **kw) -> dict:
    return {**json.loads((PRESET_DIR / name / "config.json").read_text()), **kw}


def _model_dir(tmp_path, name, **kw) -> str:
    d = tmp_path / f"model{len(list(tmp_path.glob('model*')))}"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(_preset(name, **kw)))
    return str(d)


def _plan(write_args, tmp_path, device, model=("micro-deepseek-v3", WIDE_QK), **keys):
    path = write_args(**{"model_name_or_path": _model_dir(tmp_path, model[0], **model[1]), "use_flash_attention": True,
                         "fp16": False, "bf16": True, "sharding": "", **keys})
    return plan(path, device=device, suggest_changes=False)


def _said(r) -> list[str]:
    return [n for n in r["notes"] if "flash attention refuses" in n]


def test_a_width_200_model_materialises_its_scores_on_an_l40s_and_not_on_an_h100(write_args, tmp_path):
    """flash-attn's backward takes 200 on an H100 (9.0), not on an L40S (8.9): only the L40S plan counts the
    `[b, heads, s, s]` scores, as the same file with `use_flash_attention: false` does there, and says why once."""
    assert hardware.lookup("L40S").capability == (8, 9) and hardware.lookup("H100").capability == (9, 0)
    l40s, h100 = _plan(write_args, tmp_path, "L40S"), _plan(write_args, tmp_path, "H100")
    assert (l40s["attention"], h100["attention"]) == ("math", "flash")
    assert _said(l40s) == [NOTE] and not _said(h100)
    assert l40s["attention_words"].startswith("sdpa_mask (the [b, heads, s, s] scores materialised)")
    assert h100["attention_words"].startswith("sdpa_causal (flash-attn)")
    math = _plan(write_args, tmp_path, "L40S", use_flash_attention=False)
    assert l40s["memory_breakdown_gib"] == math["memory_breakdown_gib"]
    assert l40s["memory_breakdown_gib"]["activations"] > h100["memory_breakdown_gib"]["activations"]
    assert l40s["eta_hours"] == pytest.approx(math["eta_hours"])  # flash and math: the same FLOPs, the same time


def test_mlas_width_is_its_wider_head_the_padded_value_too(write_args, tmp_path):
    """q/k 16 + 8 = 24 with v 200: the kernels see 200 (v is padded to the widest), so the L40S materialises."""
    r = _plan(write_args, tmp_path, "L40S", model=("micro-deepseek-v3", WIDE_V))
    assert r["attention"] == "math" and _said(r) == [NOTE]


def test_a_width_no_gpu_takes_materialises_on_an_h100_too(write_args, tmp_path):
    """The parity micro MLA's 12 (q/k 8 + 4, v 6): not a multiple of 8, refused on every GPU, no capability named."""
    r = _plan(write_args, tmp_path, "H100", model=("micro-deepseek-v3", {"qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
                                                                         "v_head_dim": 6, "kv_lora_rank": 12}))
    assert r["attention"] == "math"
    assert _said(r) == ["use_flash_attention: flash attention refuses head width 12 on H100-SXM (flash-attn takes "
                        f"multiples of 8 up to 256): planned with the scores materialised; {MLA_FIX_256}"]


def test_deepseek_v3s_192_runs_flash_on_the_l40s_a10_rtx4090_and_h100(write_args, tmp_path):
    for device in ("L40S", "A10", "RTX4090", "H100"):
        r = _plan(write_args, tmp_path, device, model=("micro-deepseek-v3", {"qk_nope_head_dim": 128,
                                                                             "qk_rope_head_dim": 64}))
        assert r["attention"] == "flash" and not _said(r), device


def _resolved(model: dict, *keys: str, target: Target):
    args = parse_config(None, ["--output_dir", "o", "--input_dir", "d", "--do_train", "--max_steps", "5", "--device",
                               "gpu", "--bf16", "true", "--use_flash_attention", "true", *keys])
    return resolve(args, ModelConfig.from_dict(model), target)


def test_train_on_the_gpu_the_driver_names_resolves_the_materialised_path_with_one_line():
    """`train`'s target: the driver's name and compute capability (none of the table's entries needed)."""
    model = _preset("micro-deepseek-v3", **WIDE_QK)
    run = _resolved(model, target=Target("gpu", gpu_name="NVIDIA L40S", gpu_capability=(8, 9)))
    assert run.kernels.attention == "math"
    assert [n for n in run.notes if "flash attention refuses" in n] == [
        "use_flash_attention: flash attention refuses head width 200 on NVIDIA L40S (compute capability 8.9; "
        f"flash-attn's backward above 192 runs on 8.0 and 9.0 only): the run materialises the scores; {GPU_FIX}"]
    assert _resolved(model, target=Target("gpu", gpu_name="NVIDIA H100", gpu_capability=(9, 0))).kernels.attention \
        == "flash"
    # a GPU whose capability is unknown: the width alone is judged (the kernels still fall back at run time)
    assert _resolved(model, target=Target("gpu", gpu_name="a new GPU")).kernels.attention == "flash"
    assert _resolved(model, "--device", "cpu", target=Target("cpu")).kernels.attention == "flash"  # CPU's kernel


@pytest.mark.parametrize("keys,attention", [((), "flash"), (("--attention_mask_type", "document", "--sample_mode",
                                                              "packed"), "math"),
                                            (("--context_parallel_degree", "2"), "math")])
def test_over_256_a_causal_run_keeps_sdpas_memory_efficient_kernel(keys, attention):
    """Width 264 (a multiple of 8 over 256): flash-attn refuses it, and Paddle's sdpa then runs its memory-efficient
    kernel for a causal mask (no scores held: kept flash's memory), where the document mask and context
    parallelism's blocks materialise them."""
    assert flash_width.refusal(264, (9, 0)) == ("", "flash-attn takes multiples of 8 up to 256")
    model = _preset("micro-llama", hidden_size=4 * 264, num_attention_heads=4, num_key_value_heads=4)
    world = 2 if "--context_parallel_degree" in keys else 1
    run = _resolved(model, *keys, target=Target("gpu", world, gpu_name="H100-SXM", planned=True))
    assert run.kernels.attention == attention


def test_over_256_the_causal_runs_note_says_sdpas_memory_efficient_kernel_runs():
    """Width 264 (head_dim, not MLA) on a causal run: flash's memory is kept, and one note says what runs instead
    of flash-attn, with the key to change (the `kernels:` words alone said flash-attn)."""
    model = _preset("micro-llama", hidden_size=4 * 264, num_attention_heads=4, num_key_value_heads=4)
    run = _resolved(model, target=Target("gpu", gpu_name="H100-SXM", planned=True))
    assert run.kernels.attention == "flash"
    assert [n for n in run.notes if "flash attention refuses" in n] == [
        "use_flash_attention: flash attention refuses head width 264 (flash-attn takes multiples of 8 up to 256): on "
        "H100-SXM Paddle's sdpa runs its memory-efficient kernel instead, which holds no [b, heads, s, s] scores "
        "either; for flash attention head_dim must be a multiple of 8 of at most 256"]


def test_context_parallelism_judges_flash_attentions_forward_alone():
    """The ring runs flash-attn's forward only (its backward is `ops.block_attention.block_backward`'s, its forward
    under `paddle.no_grad`), which takes 200 on an L40S: the flash blocks run there, unnoted (they were turned to the
    reference blocks for a backward flash-attn never runs); 12 is refused by the forward too."""
    l40s = Target("gpu", 2, gpu_name="NVIDIA L40S", gpu_capability=(8, 9))
    run = _resolved(_preset("micro-deepseek-v3", **WIDE_QK), "--context_parallel_degree", "2", target=l40s)
    assert run.kernels.attention == "flash" and not [n for n in run.notes if "flash attention refuses" in n]
    narrow = _preset("micro-deepseek-v3", qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, kv_lora_rank=12)
    assert _resolved(narrow, "--context_parallel_degree", "2", target=l40s).kernels.attention == "math"


def test_eval_and_generate_judge_the_models_width_as_a_forward(monkeypatch):
    """`orchestration.targets.inference_kernels` with the model (`config.compute.kernels_for`'s `flash_width`, a
    forward alone): 12 materialises on every GPU, with the note, so the `kernels:` line names sdpa_mask; 200 runs
    flash-attn's forward on an L40S too. Without the model nothing is judged (as before)."""
    from pretrain_cli.orchestration import targets

    l40s = Target("gpu", gpu_name="NVIDIA L40S", gpu_capability=(8, 9))
    monkeypatch.setattr(targets, "inference_target", lambda: l40s)
    args = parse_config(None, ["--use_flash_attention", "true", "--bf16", "true"])
    narrow = ModelConfig.from_dict(_preset("micro-deepseek-v3", qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6,
                                           kv_lora_rank=12))
    kernels, device = targets.inference_kernels(arguments=args, model_cfg=narrow)
    assert (kernels.attention, device) == ("math", "gpu")
    notes = []
    compute.kernels_for(args, l40s, notes, model_cfg=narrow)
    assert [n for n in notes if "flash attention refuses" in n] == [
        "use_flash_attention: flash attention refuses head width 12 on NVIDIA L40S (flash-attn takes multiples of 8 "
        f"up to 256): the run materialises the scores; {MLA_FIX_256}"]
    wide = ModelConfig.from_dict(_preset("micro-deepseek-v3", **WIDE_QK))
    assert targets.inference_kernels(arguments=args, model_cfg=wide)[0].attention == "flash"
    assert targets.inference_kernels(arguments=args)[0].attention == "flash"
