"""What a user sees from a launched run: the run's log lines, without Paddle's import noise, and the
launcher's logs inside the run's own output directory (scripts/launch.sh, as the README shows)."""
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NOISE = ("No ccache found", "Modified FLAGS detected", "FLAGS_enable_pir_in_executor")


def test_launched_run_is_quiet_and_logs_into_its_output_dir(corpus, tmp_path):
    cfg = {"model_name_or_path": "micro-qwen2", "device": "cpu", "input_dir": str(corpus), "output_dir": "out",
           "split": "98,2,0", "max_seq_length": 32, "per_device_train_batch_size": 2, "learning_rate": 0.002,
           "warmup_steps": 1, "max_steps": 3, "logging_steps": 1, "save_steps": 1000, "do_train": True,
           "report_to": ["none"], "seed": 7}
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLE_", "PYTHONWARNINGS", "LOG_DIR"))}
    env.update(PYTHON=sys.executable, NPROC="2", OMP_NUM_THREADS="1")
    p = subprocess.run(["bash", str(REPO / "scripts" / "launch.sh"), "cfg.json"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=180)
    logs = {n: (tmp_path / "out" / "log" / f"workerlog.{n}").read_text() for n in (0, 1)}
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:] + logs[0][-2000:]
    assert not (tmp_path / "log").exists()  # no stray ./log next to the config
    assert "global_step: 1," in p.stdout and "global_step: 3," in logs[0]  # rank 0's lines reach the console
    for where, text in (("console", p.stdout + p.stderr), ("workerlog.0", logs[0]), ("workerlog.1", logs[1])):
        assert not [n for n in NOISE if n in text], (where, text[-2000:])
    assert "LAUNCH INFO" not in p.stdout + p.stderr  # the launcher's ~30 configuration lines (LAUNCH_LOG_LEVEL)
    # the user's OMP_NUM_THREADS=1 survives the launcher's own, and each rank says what it computes with
    assert "threads: 1 per process (PRETRAIN_CLI_THREADS=1)" in logs[0] + logs[1]
    # the run ends, on the console and once, with rank 0's closing metrics and PaddleNLP's ips, then where its model is
    said = [ln.split("] - ", 1)[-1] for ln in p.stdout.splitlines() if ln.strip()]
    assert said[-9] == "***** train metrics *****" and said[-8].split() == ["progress_or_epoch", "=", "1.0"], said[-9:]
    assert said[-3].startswith("Effective Tokens per second: ") and said[-2].startswith("ips: "), said[-9:]
    assert said[-1].startswith("train: done at step 3; the final model, Hugging Face format (float32 weights), is in "
                               "out: pretrain-cli eval --model out; "), said[-9:]
    assert (p.stdout + p.stderr).count("***** train metrics *****") == 1 and "train metrics" not in logs[1]
