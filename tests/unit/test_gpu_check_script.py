"""scripts/gpu_check.sh on a machine without a GPU: it refuses in one line, and what it would run is sound.

The GPU run itself cannot happen here; what can rot unseen is the script (a shell syntax error, a config key
`plan` no longer accepts, a data-writer call that changed, a report that misreads metrics.jsonl), so each of
those is exercised on CPU: the printed commands, the argument file through `plan`, the token-file command,
and the report on a metrics.jsonl in the format `train` writes.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def _run(*args, env=None):
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHON": sys.executable, **(env or {})})


def test_the_script_parses():
    proc = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_refuses_without_a_gpu_build_in_one_line(tmp_path):
    proc = _run(env={"GPU_CHECK_DIR": str(tmp_path / "work")})
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"gpu_check: this Python ({sys.executable}) has no GPU build of Paddle (paddlepaddle-gpu); "
        f"run this on a GPU machine"]
    assert proc.stdout == "" and not (tmp_path / "work").exists()  # refused before any work


def test_unknown_option_is_one_line():
    proc = _run("--fast")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "--dry-run" in proc.stderr


def test_dry_run_prints_commands_that_work(tmp_path):
    work = tmp_path / "work"
    proc = _run("--dry-run", env={"GPU_CHECK_DIR": str(work), "STEPS": "12", "BATCH": "1", "SEQ": "64",
                                  "DEVICE": "NVIDIA A100-SXM4-80GB"})
    assert proc.returncode == 0, proc.stderr
    cmds = [line[2:] for line in proc.stdout.splitlines() if line.startswith("+ ")]
    assert [c.split()[1:3] for c in cmds] == [["-m", "pytest"], ["-c", "$'import"], ["-m", "pretrain_cli"],
                                              ["-m", "pretrain_cli"], ["scripts/gpu_check_report.py", str(work / "plan.json")]]
    assert "tests/gpu" in cmds[0] and " train " in cmds[3] and " plan " in cmds[2]
    assert not (work / "data" / "synthetic.bin").exists()  # printed, not run

    # the token-file command, as printed, writes a readable token file
    subprocess.run(["bash", "-c", cmds[1]], check=True, cwd=ROOT, timeout=120)
    from pretrain_cli.data.indexed import open_token_file

    tokens = open_token_file(work / "data" / "synthetic")
    assert tokens.num_tokens >= (12 + 5) * 1 * 65 * 2 and tokens.max_token_id() < 151936

    # the argument file resolves at the Qwen2.5-0.5B shape in bf16 with the fused/flash kernels
    out = subprocess.run(["bash", "-c", cmds[2].split(" > ")[0]], check=True, cwd=ROOT, capture_output=True, text=True, timeout=120).stdout
    plan = json.loads(out)
    assert plan["model"]["hidden"] == 896 and plan["model"]["layers"] == 24 and plan["model"]["vocab"] == 151936
    assert plan["precision"]["amp_dtype"] == "bfloat16" and plan["attention"] == "flash"
    assert plan["device"]["name"] == "A100-80GB" and plan["max_steps"] == 12 and plan["tokens_per_step"] == 64

    # the report reads metrics.jsonl as `train` writes it on GPU
    (work / "plan.json").write_text(out)
    (work / "out").mkdir()
    recs = [{"kind": "train", "step": s, "loss": 9.0, "tokens_per_sec": 1000.0 + s, "mfu": 0.25,
             "max_memory_allocated": 10.0 + s} for s in range(1, 10)]
    (work / "out" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    report = subprocess.run(["bash", "-c", cmds[4]], check=True, cwd=ROOT, capture_output=True, text=True).stdout
    assert "1008" in report and "25.0%" in report and "19.00" in report  # median of steps 6-9, their MFU, peak
    assert f"{plan['memory_gib']:.2f}" in report


FAKE = f"""#!{sys.executable}
import json, os, subprocess, sys
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps(args) + "\\n")
code = " ".join(args)
if args and args[0] == "tests/gpu/layouts.py":  # the real table
    sys.exit(subprocess.run([{sys.executable!r}, *args]).returncode)
if "device_count()" in code:
    print(os.environ["FAKE_GPUS"])
elif "pre_ampere" in code:
    print("bf16")
elif args[:2] == ["-m", "pytest"]:
    sys.exit(int(os.environ.get("FAKE_PYTEST_RC", "0")))
elif args[:3] == ["-m", "pretrain_cli", "plan"]:
    print("{{}}")
sys.exit(0)
"""


def _stubbed(tmp_path, gpus: int, **env):
    """The script as on a GPU machine with `gpus` visible GPUs: an interpreter stand-in answers Paddle's device
    count and records every command; the layout table is the real one."""
    fake = tmp_path / "python"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    log = tmp_path / "calls.jsonl"
    proc = _run(env={"PYTHON": str(fake), "FAKE_LOG": str(log), "FAKE_GPUS": str(gpus),
                     "GPU_CHECK_DIR": str(tmp_path / "work"), "DEVICE": "A100-80GB", **env})
    return proc, [json.loads(line) for line in log.read_text().splitlines()]


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_runs_to_the_end_on_1_2_4_or_8_gpus_with_the_layouts_that_fit(tmp_path, gpus):
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_layouts", ROOT / "tests" / "gpu" / "layouts.py")
    layouts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layouts)
    HALF, LAYOUTS = layouts.HALF, layouts.LAYOUTS

    proc, calls = _stubbed(tmp_path, gpus)
    assert proc.returncode == 0, proc.stderr
    pytest_call = next(c for c in calls if c[:2] == ["-m", "pytest"])
    ran = {a.split("[")[1].rstrip("]") for a in pytest_call if "[" in a}
    table = {**LAYOUTS, **HALF}
    assert ran == {name for name, (need, _) in table.items() if need <= gpus}
    assert "tests/gpu/test_kernels_gpu.py" in pytest_call
    left = [line[len("left out: "):] for line in proc.stdout.splitlines() if line.startswith("left out: ")]
    assert sorted(x.split()[0] for x in left) == sorted(n for n, (need, _) in table.items() if need > gpus)
    assert all(x.endswith(f"(needs {table[x.split()[0]][0]} GPUs)") for x in left)
    train = [c for c in calls if c[:3] == ["-m", "pretrain_cli", "train"]]
    assert len(train) == 1 and json.loads(Path(train[0][3]).read_text())["bf16"] is True  # the bf16 run is reached
    assert calls[-1][0] == "scripts/gpu_check_report.py"
    if gpus == 1:
        assert ran == set() and len(left) == len(table)


def test_a_failing_part_does_not_stop_the_check_and_is_named(tmp_path):
    proc, calls = _stubbed(tmp_path, 1, FAKE_PYTEST_RC="1")
    assert proc.returncode == 1
    assert any(c[:3] == ["-m", "pretrain_cli", "train"] for c in calls) and calls[-1][0] == "scripts/gpu_check_report.py"
    assert proc.stderr.strip().splitlines() == ["gpu_check: failed: 1/3 GPU tests"]
