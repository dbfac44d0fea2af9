"""`plan --fit`'s precision lever: the O2 note says the gradients O2's figure ran with (the file's resolved
amp_master_grad), a file naming its level is searched at it alone, and `train`'s out-of-memory hint, which says
"re-run to resume", never switches the level (a resume at O2 would build master weights from half weights)."""
from pathlib import Path

from plan_helpers import fit
from pretrain_cli.orchestration import out_of_memory_hint, planned
from pretrain_cli.planning import fit as fit_search
from pretrain_cli.planning.fit_precision import pick_precision
from pretrain_cli.planning.plan import target_device

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "configs" / "qwen3-moe-tiny_cpu.json")
QWEN3_30B = ["--model_name_or_path", "Qwen/Qwen3-30B-A3B", "--vocab_size", "151936", "--max_seq_length", "4096",
             "--bf16", "true"]


def _fit(tokens_per_sec: float) -> dict:
    return {"after": {"speed": {"tokens_per_sec": tokens_per_sec}}, "notes": []}


def test_the_o2_note_says_the_gradients_its_figure_ran_with():
    """Without amp_master_grad O2's gradients are bf16 and the note offers the key; with it they are fp32 and the
    note says so, offering nothing (it used to say bf16 gradients and offer the key the file has). Each note is one
    short line."""
    half = pick_precision(_fit(100.0), _fit(200.0), "bfloat16", master_grad=False)["notes"][-1]
    assert "O2 (bf16 weights, bf16 gradients, fp32 master weights and AdamW state) runs at 200 tokens/s" in half
    assert "`amp_master_grad: true` fp32 gradients" in half
    full = pick_precision(_fit(100.0), _fit(200.0), "bfloat16", master_grad=True)["notes"][-1]
    assert "bf16 weights, fp32 gradients (amp_master_grad)" in full
    assert "bf16 gradients" not in full and "amp_master_grad: true" not in full
    assert max(len(half), len(full)) < 250
    assert pick_precision(_fit(200.0), _fit(100.0), "bfloat16", master_grad=False)["notes"] == []  # O1 wins


def test_a_file_naming_its_level_is_not_searched_at_o2(monkeypatch):
    """--fp16_opt_level O1 keeps O1: one search, not two (O2's only fed a note), and a note says how to get O2's."""
    runs = []
    real = fit_search.fit
    monkeypatch.setattr(fit_search, "fit", lambda *a, **k: runs.append(a) or real(*a, **k))
    kept = fit(TINY, [*QWEN3_30B, "--fp16_opt_level", "O1"], device="H100", gpus=8)
    assert len(runs) == 1 and "fp16_opt_level" not in kept["change"]
    assert "precision: the file sets fp16_opt_level O1, so --fit keeps it (without the key it tries O2 too)" \
        in kept["notes"]
    runs.clear()
    fit(TINY, QWEN3_30B, device="H100", gpus=8)
    assert len(runs) == 2  # by default both levels


def test_the_out_of_memory_hint_keeps_the_files_level():
    """Qwen3-30B-A3B (bf16, O1 by default) out of memory on 8 H100: --fit's pick is O2, but the hint `train` prints
    with "re-run to resume" is O1's layout (pp 2 x EP 4): it named fp16_opt_level "O1" -> "O2"."""
    args, cfg = planned.parse(TINY, QWEN3_30B)
    run = planned._resolved(args, cfg, target_device("H100", gpus=8), 8)
    line = out_of_memory_hint.out_of_memory_line(args, cfg, run, "q.json", 5, "NVIDIA H100 80GB HBM3")
    assert "top plan suggestion for this run: pipeline_parallel_degree 1 -> 2" in line
    assert "fp16_opt_level" not in line and "re-run to resume" in line
    assert fit(TINY, QWEN3_30B, device="H100", gpus=8)["change"]["fp16_opt_level"] == "O2"  # --fit itself offers it
