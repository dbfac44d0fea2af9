"""`plan --fit` and the evaluation: a layout fits only where an evaluation of one sample a device fits beside its
step (the eval batch is lowered, never the layout's state), an evaluation keeps the samples the file as written
reads (eval batch x eval_iters x its data ranks), and the advice where none fits names the key that is on."""
from pathlib import Path
from types import SimpleNamespace

from plan_helpers import fit
from pretrain_cli.cli import main as cli_main
from pretrain_cli.planning import plan as planning
from pretrain_cli.planning.fit import fit_eval
from pretrain_cli.planning.fit_report import _eval_line, format_fit
from pretrain_cli.planning.memory import GIB

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "configs" / "qwen3-moe-tiny_cpu.json")
DENSE_TINY = str(REPO / "configs" / "tiny_cpu.json")
QWEN3_30B = ["--model_name_or_path", "Qwen/Qwen3-30B-A3B", "--vocab_size", "151936", "--max_seq_length", "4096",
             "--bf16", "true"]


def _inflate(monkeypatch, when) -> None:
    """The eval's forward 1,000 GiB larger on the setups `when` picks: an evaluation that fits at no batch."""
    real = planning.eval_parts

    def eval_parts(s, batch, stages):
        parts = real(s, batch, stages)
        return {**parts, "forward": parts["forward"] + (1000 * GIB if when(s) else 0.0)}

    monkeypatch.setattr(planning, "eval_parts", eval_parts)


def test_a_layout_whose_eval_of_one_does_not_fit_is_not_picked(monkeypatch):
    """Qwen3-30B-A3B on 8 H100: --fit's pick runs no pipeline (EP 8). With an evaluation that fits at no batch
    without a pipeline, the pick is a pipelined layout whose eval fits, where it was the same pick with an eval
    'still over the budget' (written, exit 0: out of memory at the first evaluation)."""
    _inflate(monkeypatch, lambda s: s.pp == 1)
    f = fit(TINY, QWEN3_30B, device="H100", gpus=8)
    assert f["change"]["pipeline_parallel_degree"] > 1
    assert f["eval"]["fits"] and f["eval"]["memory_gib"] <= f["budget_gib"]


def test_fit_writes_nothing_where_no_eval_fits(monkeypatch, tmp_path, capsys):
    """The tiny dense file on this CPU with an evaluation that fits nowhere: nothing fits, -o writes nothing, exit 1
    (the step alone fits: it wrote the file and exited 0)."""
    _inflate(monkeypatch, lambda s: True)
    out = tmp_path / "fitted.json"
    code = cli_main(["plan", DENSE_TINY, "--device", "cpu", "--fit", "-o", str(out)])
    printed = capsys.readouterr().out
    assert code == 1 and not out.exists() and "nothing written" in printed


def test_an_evaluation_keeps_the_files_samples_over_its_data_ranks():
    """Qwen3-30B-A3B on 8 H100 with O1 kept: the pick (pp 2 x EP 4) has 4 data ranks where the file as written has
    8, so an evaluation of 8 x 3 a rank (192 samples) becomes 4 x 12 on each of 4: eval_iters 3 -> 12 (it was 6, an
    evaluation reading half the samples)."""
    f = fit(TINY, [*QWEN3_30B, "--fp16_opt_level", "O1"], device="H100", gpus=8)
    assert f["change"]["pipeline_parallel_degree"] == 2
    assert ("per_device_eval_batch_size", 8, 4) in f["diff"] and ("eval_iters", 3, 12) in f["diff"]
    (line,) = [x for x in format_fit(f).splitlines() if x.startswith("  eval per device")]
    assert ("eval_iters 3 -> 12 (the file's 192 samples an evaluation, 8 x 3 x its 8 data ranks, over the layout's 4 "
            "data ranks)") in line


def _report(batch: int, gib_at, ranks: int):
    return SimpleNamespace(eval_batch=batch, eval_memory_gib=gib_at(batch), parallel=SimpleNamespace(data_ranks=ranks))


def test_eval_iters_follow_the_data_ranks_and_fall_back_to_a_ranks_samples():
    """fit_eval alone: an eval that fits keeps its batch and sets eval_iters for the layout's data ranks; where the
    layout's data ranks do not divide the file's samples, a rank keeps its own (said per data rank)."""
    gib = lambda b: 10.0 * b  # noqa: E731
    current = {"per_device_eval_batch_size": 2, "eval_iters": 3, "do_eval": True}
    best = {"report": _report(2, gib, 2), "change": {}}
    replan = lambda change: _report(change["per_device_eval_batch_size"], gib, 2)  # noqa: E731
    e = fit_eval(current, best, replan, 100.0, file_ranks=4)  # 2 x 3 x 4 = 24 samples, 12 a rank on 2
    assert e["batch"] == 2 and e["change"] == {"eval_iters": 6} and e["fits"]
    e = fit_eval(current, best, replan, 15.0, file_ranks=3)  # 18 samples on 2 ranks: 9 a rank, batch 1
    assert e["batch"] == 1 and e["change"] == {"per_device_eval_batch_size": 1, "eval_iters": 9}
    odd = {"report": _report(2, gib, 4), "change": {}}  # 2 x 3 x 3 = 18 samples over 4 ranks: no whole share
    e = fit_eval(current, odd, lambda c: _report(c["per_device_eval_batch_size"], gib, 4), 15.0, file_ranks=3)
    assert e["change"] == {"per_device_eval_batch_size": 1, "eval_iters": 6} and e["was"]["per_rank"]
    assert "the same 6 samples per data rank" in _eval_line(e, 15.0)


def test_an_eval_over_the_budget_at_one_names_the_key_that_is_on():
    """A do_predict-only run whose evaluation does not fit even at 1 is told to set do_predict false, not do_eval."""
    gib = lambda b: 100.0  # noqa: E731
    current = {"per_device_eval_batch_size": 2, "eval_iters": 1, "do_eval": False, "do_predict": True}
    best = {"report": _report(2, gib, 1), "change": {}}
    e = fit_eval(current, best, lambda c: _report(c["per_device_eval_batch_size"], gib, 1), 50.0)
    assert not e["fits"] and e["batch"] == 1
    line = _eval_line(e, 50.0)
    assert "set do_predict false" in line and "do_eval" not in line
