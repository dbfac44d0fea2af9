"""A CPU run that will not fit in this machine's memory is refused by `check` and `train` before it starts
(`orchestration.host_fit`): the kernel's out-of-memory killer would end it with no message (exit 137). Before,
only weights, gradients and AdamW (16 bytes a parameter) were counted, so the README's demo at 100,000 sequences a
micro-batch passed `check` and was killed."""
import json
import resource
from pathlib import Path

import pytest
from data_helpers import write_tokens

from pretrain_cli.cli import main as cli_main
from pretrain_cli.orchestration import host_fit
from pretrain_cli.planning import hardware

DEMO = Path(__file__).resolve().parents[2] / "configs" / "demo_cpu.json"


@pytest.fixture
def demo(tmp_path):
    """The README's demo file (configs/demo_cpu.json) on a small token file, without its tokenizer."""
    cfg = json.loads(DEMO.read_text())
    cfg.pop("tokenizer_name_or_path")
    cfg.update(input_dir=write_tokens(tmp_path / "data", vocab_size=2048), output_dir=str(tmp_path / "out"),
               split="100,0,0", do_eval=False, do_predict=False)
    path = tmp_path / "demo_cpu.json"
    path.write_text(json.dumps(cfg))
    return path


def _available(monkeypatch, gib: float):
    monkeypatch.setattr(hardware, "host_available_gib", lambda *a, **k: (gib, "MemAvailable"))


def test_the_demo_at_100000_sequences_is_refused_in_one_line_without_allocating(demo, monkeypatch, capsys):
    _available(monkeypatch, 20.0)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert cli_main(["check", str(demo), "--per_device_train_batch_size", "100000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    line = err[0]
    assert line.startswith("error: per_device_train_batch_size: this CPU run is planned to need ")
    need = float(line.split("planned to need ")[1].split(" GiB")[0])
    assert need > 1000  # ~1,343 GiB: 4 layers x 25.6 M tokens of activations
    for words in ("20.0 GiB available (MemAvailable)", "gradient_accumulation_steps", "(the same global batch)",
                  "max_seq_length", "recompute true", f"pretrain-cli plan {demo} --device cpu"):
        assert words in line, words
    # the micro-batch it names fits the room with the band's highest error, and keeps the global batch
    fits = int(line.split("per_device_train_batch_size to ")[1].split()[0])
    acc = int(line.split("gradient_accumulation_steps ")[1].split()[0])
    assert fits * acc == 100000 and 100 < fits < 100000
    assert not (demo.parent / "out").exists()  # nothing written
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 200 * 1024  # KiB: planned, not allocated


def test_train_refuses_it_the_same_way_before_writing(demo, run_cli):
    """`train` runs the same check (`prepare`, every rank) before Paddle builds anything: on a machine with less
    than ~1.2 TB available (every machine this suite runs on) one line, exit 2, no output directory."""
    r = run_cli("train", str(demo), "--per_device_train_batch_size", "100000")
    assert r.returncode == 2, r.stderr
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: per_device_train_batch_size: this CPU run is planned to need")
    assert "Traceback" not in r.stderr and not (demo.parent / "out").exists()


def test_a_run_that_fits_is_neither_refused_nor_noted(demo, monkeypatch, capsys):
    _available(monkeypatch, 20.0)
    assert cli_main(["check", str(demo)]) == 0
    out = capsys.readouterr().out
    assert "check: OK" in out and "memory:" not in out


def _planned(demo, *over) -> float:
    from pretrain_cli.orchestration.prepare import prepare
    from pretrain_cli.run_config import Target

    spec = prepare(str(demo), list(over), Target(device="cpu"))
    return host_fit.planned_gib(spec.run, spec.model_cfg)


def test_a_run_within_the_estimates_error_gets_a_note_not_a_refusal(demo, monkeypatch, capsys):
    need = _planned(demo, "--per_device_train_batch_size", "64")
    low, high = host_fit.MEASURED_ERROR
    _available(monkeypatch, need)  # above the lowest measured peak, below the highest
    assert need * low < need < need * high
    assert cli_main(["check", str(demo), "--per_device_train_batch_size", "64"]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if "note: memory:" in line]
    assert len(notes) == 1 and f"planned to need {need:.1f} GiB" in notes[0]
    assert "within the estimate's error (measured peaks -10% to +20% of it)" in notes[0]
    _available(monkeypatch, need * low * 0.99)  # not even the lowest fits: refused
    assert cli_main(["check", str(demo), "--per_device_train_batch_size", "64"]) == 2
    assert "error: per_device_train_batch_size:" in capsys.readouterr().err


def test_processes_on_one_host_count_each_ranks_share(demo, monkeypatch, capsys):
    """dp 2 on gloo (`check --world_size 2` of a CPU file: both processes on this machine): each rank's plan x 2."""
    per = _planned(demo, "--per_device_train_batch_size", "64")
    _available(monkeypatch, per * 1.5)  # one rank fits, two do not
    assert cli_main(["check", str(demo), "--per_device_train_batch_size", "64", "--world_size", "2"]) == 2
    err = capsys.readouterr().err
    assert f"planned to need {2 * per:.1f} GiB (2 processes on this host x {per:.2f} GiB, each" in err
    assert cli_main(["check", str(demo), "--per_device_train_batch_size", "64"]) == 0
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "4")  # a launch of 2 nodes of 2: this host runs 2
    monkeypatch.setenv("PADDLE_LOCAL_SIZE", "2")
    assert host_fit.processes_here(4) == 2


def test_paddle_ops_and_full_recompute_get_the_wide_band(demo):
    from pretrain_cli.orchestration.prepare import prepare
    from pretrain_cli.run_config import Target

    def run(*over):
        return prepare(str(demo), list(over), Target(device="cpu")).run

    assert host_fit.measured_error(run()) == host_fit.MEASURED_ERROR
    assert host_fit.measured_error(run("--recompute", "true")) == host_fit.UNCALIBRATED_ERROR
    assert host_fit.measured_error(run("--cpu_fused_ops", "false")) == host_fit.UNCALIBRATED_ERROR
    # Paddle's ops materialise the [b, heads, s, s] scores: planned as the math path, not the CPU kernel's
    assert _planned(demo, "--cpu_fused_ops", "false", "--max_seq_length", "1024") > _planned(
        demo, "--max_seq_length", "1024")


def test_available_memory_is_memavailable_or_the_cgroups_room(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24683784 kB\nMemFree:  100 kB\nMemAvailable:   20971520 kB\n")
    cg = tmp_path / "cg"
    cg.mkdir()
    assert hardware.host_available_gib(str(meminfo), str(cg)) == (20.0, "MemAvailable")  # no cgroup files
    (cg / "memory.max").write_text("max\n")
    assert hardware.host_available_gib(str(meminfo), str(cg)) == (20.0, "MemAvailable")  # no limit
    (cg / "memory.max").write_text(f"{8 * 2**30}\n")
    (cg / "memory.current").write_text(f"{3 * 2**30}\n")
    (cg / "memory.stat").write_text(f"anon 1\ninactive_file {2**30}\n")
    have, source = hardware.host_available_gib(str(meminfo), str(cg))
    assert have == 6.0 and "cgroup limit 8.0 GiB" in source  # 8 - 3 + the reclaimable 1
    (cg / "memory.max").write_text(f"{64 * 2**30}\n")  # a limit above what the machine has free: MemAvailable
    assert hardware.host_available_gib(str(meminfo), str(cg)) == (20.0, "MemAvailable")
