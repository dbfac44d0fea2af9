"""Where no count of cpu machines up to 4,096 fits, the machine line names what a process of the leanest layout still
needs and its largest part: of the step, of start-up, or of the evaluation of 1 sample, whichever is its peak. It
named the step's largest part even where the evaluation was the peak (each test failed on that code). Where fewer
processes a machine fit, the line names the --gpus_per_node and --gpus of the fewest such machines
(`machines.fewer_a_machine`)."""
import dataclasses
from pathlib import Path

from pretrain_cli.planning import hardware
from pretrain_cli.planning.hardware import Node
from pretrain_cli.planning import plan as planning
from pretrain_cli.planning.fit import leanest
from pretrain_cli.planning.memory import GIB
from pretrain_cli.planning.suggestions import machine_too_small
from plan_helpers import fit, plan

LLAMA3_8B = str(Path(__file__).resolve().parents[2] / "configs" / "llama-3-8b_pretrain.json")
LLAMA3_70B = ["--model_name_or_path", "meta-llama/Meta-Llama-3-70B"]


def test_an_evaluation_of_one_that_is_the_peak_is_named(monkeypatch):
    """Llama-3-70B on 64 GiB cpu machines with an eval forward 20 GiB larger (`eval_memory.eval_parts`): the leanest
    layout on 4,096 needs its evaluation's 30.51 GiB, the forward 20.81 of it; the line said 'logits_loss 7.98 of
    it', the step's largest part, of a step of 18.56 GiB. plan and --fit say the same line."""
    monkeypatch.setattr(hardware, "cpu_memory_gib", lambda: 64.0)
    monkeypatch.setattr(hardware, "host_available_gib", lambda: 64.0)
    real = planning.eval_parts
    monkeypatch.setattr(planning, "eval_parts", lambda s, batch, stages: {
        **real(s, batch, stages), "forward": real(s, batch, stages)["forward"] + 20 * GIB})
    (line,) = plan(LLAMA3_8B, LLAMA3_70B, device="cpu")["suggestions"]
    assert "logits_loss" not in line["why"]
    assert ("(on 4096 the leanest layout still needs 30.51 GiB a process in an evaluation of 1 sample, the forward "
            "20.81 of it, over its 7.20 GiB budget)") in line["why"]
    assert fit(LLAMA3_8B, LLAMA3_70B, device="cpu")["machine"] == line["why"]


def _planned(monkeypatch):
    from pretrain_cli.orchestration import planned

    monkeypatch.setattr(hardware, "cpu_memory_gib", lambda: 64.0)
    args, cfg = planned.parse(LLAMA3_8B, LLAMA3_70B)
    return planned.plan(args, cfg, "cpu", suggest_changes=False)


def test_leanest_is_planned_at_an_eval_batch_of_one_where_that_is_its_peak(monkeypatch):
    """`fit.leanest` returns the plan whose evaluation breakdown is the batch-1 one the line names: re-planned with
    per_device_eval_batch_size 1 where the evaluation of 1 is its peak, as it is."""
    base = _planned(monkeypatch)
    at_two = dataclasses.replace(base, eval_batch=2, eval_least_gib=base.peak_gib + 1.0)
    asked = []

    def replan(change, world, layout=True):
        asked.append(change.get("per_device_eval_batch_size"))
        return dataclasses.replace(at_two, eval_batch=change.get("per_device_eval_batch_size", 2))

    current = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 16, "sharding": "",
               "tensor_parallel_degree": 1, "use_flash_attention": True}
    r = leanest(current, base, replan, world=8)
    assert r.eval_batch == 1 and asked[-1] == 1 and asked.count(1) == 1
    # where the step is the peak, the plan is the search's own
    step = dataclasses.replace(at_two, eval_least_gib=0.0)
    assert leanest(current, base, lambda change, world, layout=True: step, world=8) is step


def test_start_up_and_step_peaks_name_their_own_parts(monkeypatch):
    base = _planned(monkeypatch)
    need = base.checkpoint.per_checkpoint_gib + base.checkpoint.parts_gib["weights"]
    big = dataclasses.replace(base, memory_gib=1.0, startup_gib=need, eval_least_gib=0.5,
                              startup_breakdown_gib={"weights": need - 1.0, "transient": 1.0, "framework": 0.0})
    assert f"a process at start-up, weights {need - 1.0:.2f} of it," in machine_too_small(base, (big, 1.0))
    step = dataclasses.replace(big, startup_gib=0.5, memory_gib=3.0, memory_breakdown_gib={"activations": 2.0,
                                                                                           "weights": 1.0})
    assert "a process, activations 2.00 of it," in machine_too_small(base, (step, 1.0))


def test_an_evaluation_peak_not_planned_at_one_is_named_once(monkeypatch):
    """A leanest plan whose evaluation of 1 is its peak but made at another eval batch names no part: the line read
    'a process in an evaluation of 1 sample of it, over ...'."""
    base = _planned(monkeypatch)
    at_two = dataclasses.replace(base, eval_batch=2, eval_least_gib=base.peak_gib + 1.0)
    line = machine_too_small(base, (at_two, 1.0))
    assert f"needs {at_two.least_gib:.2f} GiB a process in an evaluation of 1 sample, over its " in line
    assert " of it" not in line


def test_fewer_processes_a_machine_are_named_where_they_fit(monkeypatch):
    """configs/llama-3-8b_pretrain.json on 23.5 GiB cpu machines of 8 processes: no count up to 4,096 fits (the
    leanest layout's 8.78 GiB a process is over a process's 2.65), but 16 machines of 1 process do (2 a machine need
    320): the line said only 'no number of processes ... fits on machines of this one's memory either ... choose a
    smaller model'. `plan` with the flags it names suggests that count; --fit says the same line."""
    monkeypatch.setattr(hardware, "cpu_memory_gib", lambda: 23.5)
    monkeypatch.setattr(hardware, "host_available_gib", lambda *a, **k: (23.5, "MemAvailable"))
    (line,) = plan(LLAMA3_8B, [], device="cpu", gpus=8)["suggestions"]
    assert ("fits on machines of this one's memory either at 8 processes a machine (on 4096 the leanest layout "
            "still needs 8.78 GiB a process") in line["why"]
    assert ("; with fewer processes a machine some do: --gpus_per_node 1 --gpus 16 (16 machines of 1 process; "
            "`plan` with them names the keys); or choose a smaller model") in line["why"]
    assert fit(LLAMA3_8B, [], device="cpu", gpus=8)["machine"] == line["why"]
    first = plan(LLAMA3_8B, [], device="cpu", gpus=8, node=Node(gpus=1))["suggestions"][0]
    assert first["gpus"] == 16 and first["fits"]
