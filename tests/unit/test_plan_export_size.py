"""What a new MoE user met in `plan` (docs/MOE.md's walk): the final export's size is the resolved export_dtype's,
and `plan --fit -o` where nothing fits says that nothing was written."""
from pathlib import Path

from plan_helpers import plan
from pretrain_cli.cli import main as cli_main
from pretrain_cli.models.flops import param_counts
from pretrain_cli.planning.memory import GIB

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "configs" / "qwen3-moe-tiny_cpu.json")
QWEN3_30B = ["--model_name_or_path", "Qwen/Qwen3-30B-A3B", "--vocab_size", "151936", "--max_seq_length", "4096"]
DSV3 = ["--model_name_or_path", "deepseek-ai/DeepSeek-V3", "--vocab_size", "129280", "--max_seq_length", "4096"]


def test_a_bf16_runs_final_weights_are_bf16():
    """A bf16 O1 run exports bf16 (`export_dtype` auto): Qwen3-30B-A3B's final weights are 56.87 GiB, not the
    113.74 the checkpoint's fp32 weights are; export_dtype float32, or an fp32 run, gives those."""
    c = plan(TINY, [*QWEN3_30B, "--bf16", "true"], device="H100", gpus=8)["checkpoint"]
    n = param_counts(_cfg(QWEN3_30B))["total"]
    assert round(c["parts_gib"]["weights"], 2) == 113.74  # the checkpoint keeps O1's fp32 weights
    assert c["final_weights_gib"] == n * 2 / GIB and round(c["final_weights_gib"], 2) == 56.87
    assert c["total_gib"] == c["kept"] * c["per_checkpoint_gib"] + c["final_weights_gib"]
    fp32 = plan(TINY, [*QWEN3_30B, "--bf16", "true", "--export_dtype", "float32"], device="H100", gpus=8)
    assert fp32["checkpoint"]["final_weights_gib"] == n * 4 / GIB
    cpu = plan(TINY, QWEN3_30B, device="H100", gpus=8)  # fp32 run: fp32 export
    assert cpu["checkpoint"]["final_weights_gib"] == n * 4 / GIB


def test_deepseek_v3_export_keeps_its_routers_fp32():
    """DeepSeek-V3 bf16: its routers' weight and correction bias stay fp32 in the export (transformers' rule), the MTP
    module is exported too; the rest bf16: 1,271.6 GiB, not the fp32 2,543."""
    c = plan(TINY, [*DSV3, "--bf16", "true"], device="H100", gpus=8, suggest_changes=False)["checkpoint"]
    counts = param_counts(_cfg(DSV3))
    n = counts["total"] + counts["mtp"]
    fp32 = (58 + 1) * 256 * (7168 + 1)  # 58 sparse decoder layers + the MTP module's
    assert c["final_weights_gib"] == ((n - fp32) * 2 + fp32 * 4) / GIB
    assert 1271 < c["final_weights_gib"] < 1272


def _cfg(overrides):
    from pretrain_cli.orchestration.planned import parse

    return parse(TINY, overrides)[1]


def test_fit_o_that_writes_nothing_says_so(tmp_path, capsys):
    """`plan --fit -o` where no layout fits: exit 1, no file, and one line saying nothing was written and the
    command that writes one (the device count --fit found)."""
    out = tmp_path / "ds_16.json"
    argv = ["plan", TINY, *DSV3, "--bf16", "true", "--device", "H100", "--gpus", "16", "--fit", "-o", str(out)]
    assert cli_main(argv) == 1
    assert not out.exists()
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith(f"nothing written: -o {out}: no layout fits 16 x H100-SXM (above); `--gpus ")
    assert last.endswith(f" --fit -o {out}` writes the layout that fits there")
    assert cli_main([*argv, "--json"]) == 1
    captured = capsys.readouterr()
    # (its last line: a search projected past a few seconds says so on stderr first, `commands.plan.Searching`)
    *before, last = captured.err.splitlines()  # only the search's progress line may come first (a slow search)
    assert last.startswith(f"nothing written: -o {out}") and not out.exists()
    assert all(line.startswith("plan: searching ") for line in before), before
