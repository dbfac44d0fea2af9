"""A long layout search says what it does at once (`commands.plan.Searching`: one stderr line, tqdm's bar on a
terminal); the bound it skips whole splits by (`planning.fit.state_floor`) is a lower bound; and `--fit` says the
speed note `plan` says of a model too small for the FLOPs model (`planning.plan.too_small_note`)."""
import io
from collections import defaultdict
from pathlib import Path

import pytest

from pretrain_cli.cli import main as cli_main
from pretrain_cli.commands import plan as plan_cmd
from pretrain_cli.orchestration import planned
from pretrain_cli.planning import fit as fit_search
from pretrain_cli.planning import fit_candidates
from pretrain_cli.planning.plan import TOO_SMALL

REPO = Path(__file__).resolve().parents[2]
MOE = REPO / "configs" / "qwen3-moe-tiny_cpu.json"
QWEN = REPO / "tests" / "e2e" / "paddlenlp_configs" / "qwen_pretrain_argument_0p5b.json"


class _Clock:
    def __init__(self, step: float):
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("terminal", [False, True])
def test_a_search_projected_past_a_few_seconds_says_so_once(terminal, monkeypatch, capsys):
    """0.1 s a candidate (fake clock) x 1,000: one line naming the count, and on a terminal tqdm's bar after it."""
    err = _Terminal() if terminal else io.StringIO()
    monkeypatch.setattr(plan_cmd.time, "monotonic", _Clock(0.1))
    monkeypatch.setattr(plan_cmd.sys, "stderr", err)
    s = plan_cmd.Searching(1000, "224 x H100-SXM, O2")
    for _ in range(1000):
        s.update(1)
    s.close()
    text = err.getvalue()
    line = "plan: searching 1,000 candidate layouts (224 x H100-SXM, O2) for the ones that fit"
    assert text.count(line) == 1 and text.startswith(line)
    assert (s.bar is not None) == terminal
    assert ("layout/s" in text or "s/layout" in text) == terminal  # (tqdm's rate, only from the bar)
    assert capsys.readouterr().out == ""  # stdout stays the report


def test_a_short_search_says_nothing(monkeypatch):
    err = _Terminal()
    monkeypatch.setattr(plan_cmd.time, "monotonic", _Clock(0.0001))
    monkeypatch.setattr(plan_cmd.sys, "stderr", err)
    s = plan_cmd.Searching(5000, "8 x H100-SXM, O1")
    for _ in range(5000):
        s.update(1)
    s.close()
    assert err.getvalue() == "" and s.bar is None


def test_the_search_reports_each_candidate_and_closes():
    calls = []

    class Recorder:
        def __init__(self, total, what):
            calls.append(("start", total, what))

        def update(self, n=1):
            calls.append(("update", n))

        def close(self):
            calls.append(("close",))

    planned.fit_file(str(QWEN), ["--max_seq_length", "4096"], device="V100-16GB", gpus=8, progress=Recorder)
    starts = [c for c in calls if c[0] == "start"]
    assert len(starts) == 1 and starts[0][2] == "8 x V100-16GB, O2"  # (the file sets O2: one search)
    assert sum(c[1] for c in calls if c[0] == "update") == starts[0][1] > 100
    assert calls[-1] == ("close",)


@pytest.mark.parametrize("path,overrides,device,gpus", [
    (QWEN, ["--max_seq_length", "4096", "--fp16_opt_level", "O1"], "V100-16GB", 8),  # O1: weights as gradients
    (QWEN, ["--max_seq_length", "4096"], "V100-16GB", 8),  # the file's O2
    (MOE, ["--bf16", "true"], "H100", 8),  # experts, O1
    (MOE, ["--bf16", "true", "--fp16_opt_level", "O2"], "H100", 8),  # experts, O2
    (MOE, [], "cpu", 4),  # fp32 on cpu processes
], ids=["dense-o1", "dense-o2", "moe-o1", "moe-o2", "moe-cpu"])
def test_the_state_floor_bounds_every_candidate_of_its_split(path, overrides, device, gpus):
    """No candidate needs less than any candidate's `state_floor` of the same split (its keys but micro-batch,
    accumulation, recompute and attention): what skipping a split whose floor is over the budget relies on."""
    args, cfg = planned.parse(str(path), overrides)
    base = planned.plan(args, cfg, device, gpus, suggest_changes=False)
    replan = planned._replanner(args, cfg, device, gpus, None, 0.0, None)
    current = planned._current(args)
    floors, leasts = defaultdict(float), defaultdict(lambda: float("inf"))
    for change in fit_candidates.candidates(current, base.global_batch, gpus, base.max_seq_length, base.model.experts,
                                            base.device.links.gpus_per_node):
        r = replan(change, layout=False)
        if r is None:
            continue
        split = frozenset((k, v) for k, v in change.items()
                          if k not in fit_search.MICRO_KEYS + fit_search.STEP_KEYS)
        floors[split] = max(floors[split], fit_search.state_floor(r))
        leasts[split] = min(leasts[split], r.least_gib)
    assert len(floors) > 20 and all(floors[k] > 0 for k in floors)
    assert all(leasts[k] >= floors[k] for k in floors), [(k, leasts[k], floors[k]) for k in floors
                                                         if leasts[k] < floors[k]][:3]


def test_fit_says_the_too_small_note_plan_says(tmp_path, capsys):
    """The tiny MoE planned in bf16 for 8 H100: `plan` notes that its speed is far too optimistic; `--fit -o` (O2
    chosen) says it of its layout too, before the predicted speed it qualifies (it printed 377,624,264 ->
    469,396,666 tokens/s without a word)."""
    bf16 = ["--device", "H100", "--gpus", "8", "--bf16", "true"]
    assert cli_main(["plan", str(MOE), *bf16]) == 0
    said = [line.strip() for line in capsys.readouterr().out.splitlines() if TOO_SMALL in line]
    assert len(said) == 1 and said[0].startswith("note: " + TOO_SMALL)
    assert cli_main(["plan", str(MOE), *bf16, "--fit", "-o", str(tmp_path / "fit8.json")]) == 0
    out = capsys.readouterr().out.splitlines()
    notes = [i for i, line in enumerate(out) if line.startswith("note: " + TOO_SMALL)]
    speed = [i for i, line in enumerate(out) if line.startswith("  predicted speed: ")]
    assert len(notes) == 1 and len(speed) == 1 and notes[0] < speed[0]
    assert "fp16_opt_level" in "\n".join(out) and "far too optimistic" in out[notes[0]]
