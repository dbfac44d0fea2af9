"""What `plan` tells a new user about defaults `train` on the target would regret: a GPU plan of a file without
bf16/fp16 (fp32 on the non-tensor-core peak), checkpoints that no disk will hold, and a CPU plan's ETA from the
peak `train` logs its CPU MFU against."""
import collections
import os

import pytest

from pretrain_cli.cli import main as cli_main
from pretrain_cli.planning import hardware
from pretrain_cli.training import metrics
from plan_helpers import plan
from test_run_config_plan import ZEN4

Usage = collections.namedtuple("Usage", "total used free")
REAL_PEAK = hardware.cpu_peak_tflops  # (before any test fakes it)


@pytest.fixture
def machine(monkeypatch):
    """This machine faked: 2000 GiB of memory, 8 cores (no thread variables), ZEN4's clock and flags, a disk with
    `disk["free"]` GiB free that records the directory it was asked about."""
    disk = {"free": 1e9, "asked": []}

    def usage(path):
        disk["asked"].append(str(path))
        return Usage(2**50, 0, int(disk["free"] * 2**30))

    monkeypatch.setattr(hardware, "cpu_memory_gib", lambda: 2000.0)
    monkeypatch.setattr(hardware, "host_available_gib", lambda *a, **k: (2000.0, "MemAvailable"))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    for var in ("PRETRAIN_CLI_THREADS", "OMP_NUM_THREADS", "PADDLE_LOCAL_SIZE", "PADDLE_TRAINER_ID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(hardware, "cpu_peak_tflops", lambda **kw: REAL_PEAK(ZEN4, max_khz=[], **kw))
    monkeypatch.setattr(hardware.shutil, "disk_usage", usage)
    return disk


def test_a_gpu_plan_of_a_file_without_half_precision_says_fp32_and_what_bf16_would_give(write_args, machine):
    """`plan moe_cpu.json --device H100` showed "precision float32" and 67 TFLOPS with no word: the plan stays fp32
    (what `train` there runs), and one line names the key and the bf16 peak and ETA beside."""
    fp32 = write_args(fp16=False, fp16_opt_level="O1")
    r = plan(fp32, device="H100", gpus=8)
    assert r["precision"]["amp_dtype"] == "float32" and r["device"]["peak_tflops"] == 67.0
    note = next(n for n in r["notes"] if n.startswith("precision: WARNING"))
    traffic = r["eta_traffic_hours"]  # its 8 ranks' traffic, which the peak does not shorten
    half = (r["eta_hours"] - traffic) / (989 * 0.4 / (67 * 0.3)) + traffic
    assert traffic > 0 and "neither bf16 nor fp16, so `train` on H100-SXM runs fp32 as planned here" in note
    assert "`bf16: true` (with `fp16_opt_level: O2` for half-precision weights) trains on its 989 TFLOPS" in note
    assert 1 / 60 < r["eta_hours"] < 1  # (both times in the fp32 one's unit, minutes: `eta.unit`)
    assert f"ETA {half * 60:.2f} min at MFU 0.40, {r['eta_hours'] / half:.3g}x sooner" in note
    assert "`fp16: true`" in next(n for n in plan(fp32, device="V100-32GB")["notes"] if "neither" in n)  # no bf16
    given = next(n for n in plan(fp32, device="H100", peak_tflops=50.0)["notes"] if "neither" in n)
    assert "set `bf16: true`" in given and "ETA" not in given  # a peak the user gave is not scaled
    filed = write_args(fp16=False, fp16_opt_level="O1", peak_tflops=50.0)
    assert [n for n in plan(filed, device="H100")["notes"] if "neither" in n] == [given]  # the file's too
    assert not [n for n in plan(write_args(), device="H100")["notes"] if "neither" in n]  # fp16 O2: no note
    assert not [n for n in plan(fp32, device="cpu")["notes"] if "neither" in n]  # the CPU runs fp32 anyway


def test_the_fp32_note_scales_no_peak_the_user_gave():
    """A peak the user gave (--peak_tflops, the file's peak_tflops) is theirs, not the table's non-tensor-core one:
    the table's half-precision peak over it would be no speed-up of anything, so the note names the key alone."""
    from types import SimpleNamespace

    from pretrain_cli.planning.speed import fp32_on_gpu_note

    r = SimpleNamespace(eta_hours=10.0, eta_traffic_hours=0.0, mfu=0.3, device=SimpleNamespace(peak_tflops=67.0),
                        measured_mfu=None, notes=())
    head = "precision: WARNING: the file sets neither bf16 nor fp16, so `train` on {} runs fp32 as planned here; "
    tail = ("set `{}: true` (with `fp16_opt_level: O2` for half-precision weights) to train on its {} tensor cores, "
            "and plan again")
    h100, v100 = hardware.lookup("H100"), hardware.lookup("V100")
    assert fp32_on_gpu_note(h100, r, None, True, 0.4) == [head.format("H100-SXM") + tail.format("bf16", "bf16")]
    assert fp32_on_gpu_note(v100, r, 0.5, True, 0.4) == [head.format("V100-32GB") + tail.format("fp16", "fp16")]
    sooner = 989 * 0.4 / (67 * 0.3)  # the same plan with the table's peak: the ETA at bf16's
    assert "(67 TFLOPS non-tensor-core, ETA 10.00 h)" in fp32_on_gpu_note(h100, r, None, False, 0.4)[0]
    assert f"ETA {10 / sooner:.2f} h at MFU 0.40" in fp32_on_gpu_note(h100, r, None, False, 0.4)[0]


def test_checkpoints_every_save_keeps_are_warned_with_the_limit_to_set(write_args, machine):
    """save_total_limit unset, 1000 saves: the report printed "x 1000 kept ... GiB on disk" and nothing else. A GPU
    plan cannot see the training host's disk, so the rule there is a count (more than 10 kept), the disk untouched."""
    path = write_args(save_total_limit=None, save_steps=10)
    r = plan(path, device="H100")
    c = r["checkpoint"]
    assert c["kept"] == 1000
    note = next(n for n in r["notes"] if n.startswith("checkpoints: WARNING"))
    keep2 = 2 * c["per_checkpoint_gib"] + c["final_weights_gib"]
    assert f"save_total_limit is not set, so all 1000 saves are kept: {c['total_gib']:.2f} GiB on disk" in note
    assert note.endswith(f"`save_total_limit: 2` keeps the newest 2: {keep2:.2f} GiB with the final weights")
    assert not machine["asked"]
    assert not [n for n in plan(write_args(save_steps=10), device="H100")["notes"] if "checkpoints:" in n]
    assert not [n for n in plan(write_args(save_total_limit=None, save_steps=1000), device="H100")["notes"]
                if "checkpoints:" in n]  # 10 kept: at the line, not over it


def test_a_cpu_plan_compares_checkpoints_with_output_dirs_disk(write_args, machine, tmp_path):
    """`--device cpu` plans this machine, so output_dir's disk is the one the run writes to: its nearest existing
    directory's filesystem, named in the line, with the save_total_limit that fits there."""
    out = tmp_path / "runs" / "not-yet"
    r = plan(write_args(output_dir=str(out)), device="cpu")  # 2 kept of 2 saves
    c = r["checkpoint"]
    assert not [n for n in r["notes"] if "checkpoints:" in n] and machine["asked"][-1] == str(tmp_path)
    machine["free"] = c["total_gib"] - 0.5 * c["per_checkpoint_gib"]  # one checkpoint fewer fits
    note = next(n for n in plan(write_args(output_dir=str(out)), device="cpu")["notes"] if "checkpoints:" in n)
    assert note.startswith(f"checkpoints: WARNING: {c['total_gib']:.2f} GiB of checkpoints is more than the "
                           f"{machine['free']:.2f} GiB free on the filesystem of {tmp_path} (output_dir's nearest "
                           f"existing directory, on this machine)")
    assert f"`save_total_limit: 1` keeps the newest 1: {c['total_gib'] - c['per_checkpoint_gib']:.2f} GiB" in note
    machine["free"] = 0.1
    note = next(n for n in plan(write_args(output_dir=str(out)), device="cpu")["notes"] if "checkpoints:" in n)
    assert note.endswith(f"free space there or choose another output_dir (one checkpoint and the final weights need "
                         f"{c['per_checkpoint_gib'] + c['final_weights_gib']:.2f} GiB)")


def test_a_cpu_plan_has_an_eta_from_the_peak_train_logs_its_mfu_against(write_args, machine, capsys):
    """`plan --device cpu` printed "ETA: unknown" while `train` logs an assumed CPU peak: the same function gives
    the plan's peak now (each of N processes its share of the cores), and the ETA says what it rests on."""
    one, two = plan(write_args(), device="cpu"), plan(write_args(), device="cpu", gpus=2)
    # train's MFU peak is this one, in the same words (through `hardware.cpu_peak_tflops`, faked here)
    assert metrics.resolve_peak("cpu", None, None) == (one["device"]["peak_tflops"], one["device"]["peak_source"])
    assert one["device"]["peak_tflops"] == pytest.approx(8 * 2.59615 * 64 / 1e3)
    assert two["device"]["peak_tflops"] == pytest.approx(4 * 2.59615 * 64 / 1e3)  # 8 cores / 2 processes
    assert "an assumed fp32 peak of 1329.2 GFLOP/s = 8 core(s)" in one["device"]["peak_source"]
    assert one["eta_hours"] == pytest.approx(10_000 * 1024 * one["flops_per_token"]["model"]
                                             / (one["device"]["peak_tflops"] * 1e12 * 0.3) / 3600)
    assert cli_main(["plan", write_args(), "--device", "cpu"]) == 0
    eta = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("ETA"))
    # not "a lower bound": a 4-layer Qwen3 (hidden 256) on 2 Xeon cores logged mfu 0.74-0.82 against this peak, and
    # its 300 steps took 3.6 min where the ETA at MFU 0.30 said 7.75 min "as a lower bound"
    assert eta.endswith(f"= {one['eta_hours']:.2f} h; cpu: an estimate, not a bound (peak and MFU assumed): "
                        f"train's logged mfu as --measured_mfu times it")


def test_check_warns_of_the_checkpoints_too_against_the_disk_only_on_the_host(write_args, machine, tmp_path):
    """`check` runs where `train` will: the same warning, against output_dir's disk unless --world_size simulates a
    launch elsewhere (then the count alone)."""
    from pretrain_cli.commands.check import checkpoint_warning

    def spec(**keys):
        return _check_spec(write_args(output_dir=str(tmp_path / "out"), **keys))

    kept = plan(write_args(), device="cpu")["checkpoint"]
    assert checkpoint_warning(spec(), True) == []
    machine["free"] = 0.5 * kept["total_gib"]
    assert checkpoint_warning(spec(), True)[0].startswith(f"warning: checkpoints: {kept['total_gib']:.2f} GiB of "
                                                          f"checkpoints is more than the {machine['free']:.2f} GiB free")
    assert checkpoint_warning(spec(), False) == []  # a simulated launch: not this machine's disk
    many = checkpoint_warning(spec(save_total_limit=None, save_steps=10), False)
    assert many and many[0].startswith("warning: checkpoints: save_total_limit is not set, so all 1000 saves are kept")
    assert checkpoint_warning(spec(do_train=False, do_eval=True), True) == []  # no training: no checkpoints


def _check_spec(path):
    """What `check` hands `checkpoint_warning`: the file resolved for this machine's CPU, and its model."""
    from types import SimpleNamespace

    from pretrain_cli.orchestration import planned
    from pretrain_cli.planning.plan import target_device

    args, cfg = planned.parse(path, [])
    return SimpleNamespace(run=planned._resolved(args, cfg, target_device("cpu"), 1), model_cfg=cfg)


def test_check_sizes_the_checkpoints_without_the_whole_plan(write_args, machine, tmp_path, monkeypatch):
    """`check` ran the whole planner (memory, speed, layout) for the checkpoint sizes alone: it reads
    `planning.plan.checkpoint_plan` now, the plan's own figures, and words the plan's advice as its warning."""
    import dataclasses

    from pretrain_cli.commands.check import checkpoint_warning
    from pretrain_cli.planning import plan as planner

    path = write_args(output_dir=str(tmp_path / "out"), save_total_limit=None, save_steps=10)
    r = plan(path, device="cpu")
    note = next(n for n in r["notes"] if n.startswith("checkpoints: WARNING: "))

    def whole_plan(*a, **k):
        raise AssertionError("check ran the whole planner for the checkpoint sizes")

    monkeypatch.setattr(planner, "report", whole_plan)
    spec = _check_spec(path)
    assert dataclasses.asdict(planner.checkpoint_plan(spec.run, spec.model_cfg)) == r["checkpoint"]
    assert checkpoint_warning(spec, True) == [f"warning: checkpoints: {note.removeprefix('checkpoints: WARNING: ')}"]
    assert "all 1000 saves are kept" in note
