"""`--fit` remembers the parallel-layout rules' refusals by what the rules read (`orchestration.layout_refusals`):
the same answers as resolving every candidate, with most refused candidates answered from what was remembered."""
from pathlib import Path

from plan_helpers import fit
from pretrain_cli.orchestration import layout_refusals, planned
from pretrain_cli.orchestration.layout_refusals import LayoutRefusals
from pretrain_cli.planning.plan import target_device

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "configs" / "qwen3-moe-tiny_cpu.json")
LLAMA_70B = str(REPO / "configs" / "llama-3.1-70b_pretrain.json")
QWEN3_30B = ["--model_name_or_path", "Qwen/Qwen3-30B-A3B", "--vocab_size", "151936", "--max_seq_length", "4096",
             "--bf16", "true"]


def test_the_answers_are_those_of_resolving_every_candidate(monkeypatch):
    """Qwen3-30B-A3B on 8 H100 (O1 and O2 searched) and Llama-3.1-70B on 64: `--fit`'s whole result is the same
    with the verdicts remembered and with every candidate resolved (nothing remembered, nothing probed apart), and
    the remembered verdicts answered most of the MoE search's refused candidates."""
    answered = []
    remembered = LayoutRefusals.remembered
    monkeypatch.setattr(LayoutRefusals, "remembered", lambda self, *a: answered.append(remembered(self, *a))
                        or answered[-1])
    fast = [fit(TINY, QWEN3_30B, device="H100", gpus=8), fit(LLAMA_70B, [], device="H100", gpus=64)]
    assert answered.count(True) > 1000
    monkeypatch.setattr(LayoutRefusals, "remembered", lambda self, *a: None)
    monkeypatch.setattr(LayoutRefusals, "probe", lambda self, *a: False)  # (`config.resolve` alone refuses)
    assert fast == [fit(TINY, QWEN3_30B, device="H100", gpus=8), fit(LLAMA_70B, [], device="H100", gpus=64)]


def _refusals():
    args, cfg = planned.parse(TINY, QWEN3_30B)
    return LayoutRefusals(args, cfg, planned._target(target_device("H100", gpus=8), 8, candidate=True))


def test_a_refusal_is_remembered_for_what_the_rules_do_not_read():
    """Sequence parallelism with a MoE model is refused whatever the micro-batch (which the rules do not read): one
    probe, then remembered at another micro-batch and on no other world or degree."""
    r = _refusals()
    sp = {"tensor_parallel_degree": 2, "sequence_parallel": True}
    assert r.remembered(sp, 8) is None
    assert r.probe(planned.with_changes(r.args, sp), 8) is True
    assert r.remembered({**sp, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2}, 8) is True
    assert r.remembered(sp, 16) is None and r.remembered({**sp, "tensor_parallel_degree": 4}, 8) is None
    tp = {"tensor_parallel_degree": 2}
    assert r.probe(planned.with_changes(r.args, tp), 8) is False and r.remembered(tp, 8) is False


def test_a_verdict_that_read_beyond_the_values_is_not_remembered(monkeypatch):
    """Rules that read anything but a section's values (here `Arguments.explicit`) leave nothing remembered."""
    def rules(args, model_cfg, target, notes, problems):
        if "sharding" in args.explicit:
            problems.add("refused")

    monkeypatch.setattr(layout_refusals, "resolve_parallel", rules)
    r = _refusals()
    change = {"sharding": "stage3"}
    assert r.probe(planned.with_changes(r.args, change), 8) is True and r.remembered(change, 8) is None
