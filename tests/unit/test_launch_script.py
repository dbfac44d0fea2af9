"""scripts/launch.sh on a CPU machine: the launcher command it builds (a stand-in PYTHON records it), its restarts
(MAX_RESTART, a failed rendezvous) and its refusal of a live run's output_dir. How the launcher it runs,
scripts/paddle_launch.py, ends on a stop's signal: test_paddle_launch_stops.py."""
import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "launch.sh"

FAKE_PYTHON = """#!/usr/bin/env bash
# '-c' probes (is this a GPU build?) answer "no"; the launcher call is recorded.
if [ "$1" = "-c" ]; then exit 1; fi
# job.py ports -- PYTHON CMD...: the launcher call itself (recorded below); job.py decide, held, output_dir: the real one
case "$1" in *job.py) if [ "$2" = "ports" ]; then shift 4; else exec "${REAL_PYTHON:-python3}" "$@"; fi;; esac
echo "$@" > "$RECORD"
echo "$PYTHONWARNINGS" > "$RECORD.warnings"
echo "${PRETRAIN_CLI_THREADS:-unset}" > "$RECORD.threads"
"""


def _launch(tmp_path, *extra, **env):
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    record = tmp_path / "cmd.txt"
    e = {k: v for k, v in os.environ.items() if k not in ("NPROC", "MASTER", "MKL_DEBUG_CPU_TYPE", "LOG_DIR",
                                                          "OMP_NUM_THREADS", "PRETRAIN_CLI_THREADS", "MAX_RESTART")}
    e.update(PYTHON=str(fake), RECORD=str(record), **env)
    out = subprocess.run(["bash", str(SCRIPT), "cfg.json", "--max_steps", "3", *extra], env=e, capture_output=True,
                         text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    (tmp_path / "stderr.txt").write_text(out.stderr)
    return record.read_text().split()


def test_cpu_defaults_to_one_process_per_node(tmp_path):
    cmd = _launch(tmp_path)
    assert cmd[0] == str(SCRIPT.parent / "paddle_launch.py")  # Paddle's launcher without its HTTP polling lines
    assert cmd[cmd.index("--nproc_per_node") + 1] == "1"
    assert "--devices" not in cmd
    assert cmd[-3:] == ["cfg.json", "--max_steps", "3"]
    assert cmd[cmd.index("--log_dir") + 1] == "log"  # no readable cfg.json: no output_dir to put it in


def test_gpu_ids_on_a_cpu_machine_are_said_to_run_nproc_processes(tmp_path):
    """DEVICES=0,1 (a GPU user's habit) on a machine whose Paddle has no GPU: one line says NPROC decides."""
    cmd = _launch(tmp_path, DEVICES="0,1")
    assert cmd[cmd.index("--nproc_per_node") + 1] == "1" and "--devices" not in cmd
    assert ("launch.sh: DEVICES=0,1 names GPUs, but there is no usable GPU (or Paddle failed to import): "
            "running NPROC=1 CPU process(es); NPROC sets how many") in (tmp_path / "stderr.txt").read_text()


def test_launcher_logs_go_to_the_runs_output_dir_and_its_warning_is_quiet(tmp_path):
    (tmp_path / "cfg.json").write_text('{"output_dir": "./runs/a/"}')
    cmd = _launch(tmp_path)
    assert cmd[cmd.index("--log_dir") + 1] == "./runs/a/log"
    assert "ignore:No ccache found" in (tmp_path / "cmd.txt.warnings").read_text()
    cmd = _launch(tmp_path, "--output_dir", "elsewhere")  # the command line wins, as in training
    assert cmd[cmd.index("--log_dir") + 1] == "elsewhere/log"
    cmd = _launch(tmp_path, LOG_DIR="/tmp/x")
    assert cmd[cmd.index("--log_dir") + 1] == "/tmp/x"
    # several nodes share output_dir and each numbers its workers from 0: a log directory per node
    cmd = _launch(tmp_path, MASTER="10.0.0.1:8090", NNODES="2", NODE_RANK="1")
    assert cmd[cmd.index("--log_dir") + 1] == "./runs/a/log/node-1"
    cmd = _launch(tmp_path, MASTER="10.0.0.1:8090", NNODES="2")
    assert cmd[cmd.index("--log_dir") + 1] == f"./runs/a/log/node-{os.uname().nodename}"


def test_launcher_is_quiet_keeps_the_users_threads_and_gets_max_restart(tmp_path):
    cmd = _launch(tmp_path)
    assert cmd[cmd.index("--log_level") + 1] == "WARNING"  # no ~30 `LAUNCH INFO` configuration lines
    assert cmd[cmd.index("--max_restart") + 1] == "0"  # not the launcher's own default of 3
    assert (tmp_path / "cmd.txt.threads").read_text().strip() == "unset"  # each worker takes its share of cores
    cmd = _launch(tmp_path, MAX_RESTART="1", OMP_NUM_THREADS="1", LAUNCH_LOG_LEVEL="INFO")
    assert cmd[cmd.index("--max_restart") + 1] == "1" and cmd[cmd.index("--log_level") + 1] == "INFO"
    # the launcher's `import paddle` pins OMP_NUM_THREADS=1 for every worker: the user's value travels apart
    assert (tmp_path / "cmd.txt.threads").read_text().strip() == "1"


def test_nproc_overrides_and_no_math_environment_is_forced(tmp_path):
    cmd = _launch(tmp_path, NPROC="2")
    assert cmd[cmd.index("--nproc_per_node") + 1] == "2"
    # MKL_DEBUG_CPU_TYPE is runtime.setup_env's decision (AMD only); the wrapper must not export it
    fake_env = tmp_path / "python"
    fake_env.write_text(FAKE_PYTHON.replace('echo "$@" > "$RECORD"', 'echo "${MKL_DEBUG_CPU_TYPE:-unset}" > "$RECORD"'))
    out = subprocess.run(["bash", str(SCRIPT), "cfg.json"], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                         env={k: v for k, v in os.environ.items() if k != "MKL_DEBUG_CPU_TYPE"}
                         | {"PYTHON": str(fake_env), "RECORD": str(tmp_path / "env.txt")})
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "env.txt").read_text().strip() == "unset"


# A launcher that fails with the exit codes listed in $CODES (one per call, then 0), recording each call; at call
# n it leaves $VERDICT_n (if set) as rank 1's own verdict, as a rank launched by launch.sh does.
FLAKY_PYTHON = """#!/usr/bin/env bash
if [ "$1" = "-c" ]; then exit 1; fi
# job.py ports -- PYTHON CMD...: the launcher call itself (recorded below); job.py decide: the real one
case "$1" in *job.py) if [ "$2" = "ports" ]; then shift 4; else exec python3 "$@"; fi;; esac
echo "$@" >> "$RECORD"
n=$(wc -l < "$RECORD")
verdict=$(printenv "VERDICT_$n" || true)
if [ -n "$verdict" ]; then echo "$verdict" > "$PRETRAIN_CLI_VERDICTS/rank-1.json"; fi
code=$(echo "$CODES" | cut -d, -f"$n")
exit "${code:-0}"
"""


def _flaky(tmp_path, codes: str, max_restart: str, **verdicts):
    fake = tmp_path / "python"
    fake.write_text(FLAKY_PYTHON)
    fake.chmod(0o755)
    record = tmp_path / "calls.txt"
    record.unlink(missing_ok=True)
    e = {k: v for k, v in os.environ.items() if k not in ("NPROC", "MASTER", "LOG_DIR", "MAX_RESTART")}
    e.update(PYTHON=str(fake), RECORD=str(record), CODES=codes, MAX_RESTART=max_restart, **verdicts)
    out = subprocess.run(["bash", str(SCRIPT), "cfg.json"], env=e, capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)
    return out, record.read_text().splitlines()


def test_max_restart_reruns_a_failed_job_resuming_never_overwriting(tmp_path):
    out, calls = _flaky(tmp_path, "1,137", "3")
    assert out.returncode == 0 and len(calls) == 3
    assert not calls[0].endswith("--overwrite_output_dir false")  # the first attempt runs as written
    assert all(c.endswith("cfg.json --overwrite_output_dir false") for c in calls[1:])
    assert "restart 1 of 3" in out.stderr and "restart 2 of 3" in out.stderr
    out, calls = _flaky(tmp_path, "1,1,1", "2")  # gives up, with the last exit code
    assert out.returncode == 1 and len(calls) == 3 and "giving up (MAX_RESTART=2)" in out.stderr
    out, calls = _flaky(tmp_path, "2", "3")  # a usage error is not retried
    assert out.returncode == 2 and len(calls) == 1
    out, calls = _flaky(tmp_path, "1", "0")  # default: no restart
    assert out.returncode == 1 and len(calls) == 1


def test_the_jobs_exit_code_is_the_failing_ranks_own_verdict(tmp_path):
    """Paddle's launcher exits with the lowest failed rank's code: 247 when rank 0 was killed because rank 1 hit a
    usage error. The rank's own record decides: exit 2, never retried."""
    usage = '{"rank": 1, "exit": 2, "kind": "usage", "line": "missing shard", "time": 1}'
    out, calls = _flaky(tmp_path, "247", "2", VERDICT_1=usage)
    assert out.returncode == 2 and len(calls) == 1, out.stderr
    assert "restart" not in out.stderr
    killed = '{"rank": 1, "exit": 137, "kind": "died", "line": "killed", "time": 1}'
    out, calls = _flaky(tmp_path, "247,247", "1", VERDICT_1=killed, VERDICT_2=killed)  # a kill is retried
    assert out.returncode == 137 and len(calls) == 2 and "restart 1 of 1" in out.stderr


def test_a_failed_rendezvous_is_retried_with_new_ports_without_counting_as_a_restart(tmp_path):
    join = '{"rank": 1, "exit": 75, "kind": "transient", "line": "could not join", "time": 1}'
    out, calls = _flaky(tmp_path, "75,75", "0", VERDICT_1=join, VERDICT_2=join)
    assert out.returncode == 0 and len(calls) == 3, out.stderr
    assert "could not join the process group; trying again with new ports (2 of 3)" in out.stderr
    out, calls = _flaky(tmp_path, "75,75,75,75,75", "0", **{f"VERDICT_{n}": join for n in range(1, 6)})
    assert out.returncode == 75 and len(calls) == 4  # three retries, then the job's own verdict


def test_a_live_run_holding_output_dir_refuses_the_launch_before_the_launcher_opens_its_logs(tmp_path):
    """The launcher's logs are output_dir/log: a second launch into a running job's directory is refused by
    launch.sh itself (the lock's one line, exit 2), not by the second job's rank 0 writing into the first's log.
    Several nodes (MASTER) start together and node 0's rank 0 takes the lock: asked on node 0 only (its rank 0 has
    not started yet; the other nodes' job's rank 0 may hold it already). A stale lock: launched."""
    import json
    import socket


    (tmp_path / "cfg.json").write_text('{"output_dir": "run"}')
    (tmp_path / "run").mkdir()
    lock = tmp_path / "run" / "run.lock"
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "started": "then"}))
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER", "LOG_DIR")}
    env.update(PYTHON=str(fake), RECORD=str(tmp_path / "cmd.txt"))
    out = subprocess.run(["bash", str(SCRIPT), "cfg.json"], env=env, capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)
    assert out.returncode == 2 and not (tmp_path / "cmd.txt").exists()
    refused = (f"error: output_dir: run is in use by another run (pid {os.getpid()} on this host, started then); "
               f"wait for it to finish, stop it, or choose another output_dir")
    assert out.stderr.strip() == refused
    # W2/R8: a second two-node job's node 0 wrote log/node-0 into the live run's folder (its rank 0 refused later)
    out = subprocess.run(["bash", str(SCRIPT), "cfg.json"], env={**env, "MASTER": "10.0.0.1:8090", "NNODES": "2",
                                                                 "NODE_RANK": "0"},
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 2 and not (tmp_path / "cmd.txt").exists() and out.stderr.strip() == refused
    cmd = _launch(tmp_path, "--output_dir=free")  # the command line's directory is asked, in either spelling
    assert cmd[cmd.index("--log_dir") + 1] == "free/log"
    assert "--log_dir" in _launch(tmp_path, MASTER="10.0.0.1:8090", NNODES="2", NODE_RANK="1")
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": 2**22 + 7, "started": "then"}))  # gone
    assert "--log_dir" in _launch(tmp_path)


def test_a_yaml_argument_files_output_dir_holds_the_logs_and_its_live_run_refuses_the_launch(tmp_path):
    """launch.sh read output_dir with json.load: a YAML argument file's logs went to ./log and the check of a live
    run holding its output_dir was skipped. It reads the file as the run does (config/parser.read_argument_file)."""
    import json
    import socket
    import sys

    (tmp_path / "cfg.yaml").write_text("# PaddleFormers' form of the same keys\noutput_dir: ./runs/y/\nmax_steps: 3\n")
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER", "LOG_DIR", "NPROC", "MAX_RESTART")}
    env.update(PYTHON=str(fake), RECORD=str(tmp_path / "cmd.txt"), REAL_PYTHON=sys.executable)

    def launch():
        return subprocess.run(["bash", str(SCRIPT), "cfg.yaml"], env=env, capture_output=True, text=True, timeout=60,
                              cwd=tmp_path)

    out = launch()
    cmd = (tmp_path / "cmd.txt").read_text().split()
    assert out.returncode == 0 and cmd[cmd.index("--log_dir") + 1] == "./runs/y/log", out.stderr
    (tmp_path / "cmd.txt").unlink()
    (tmp_path / "runs" / "y").mkdir(parents=True)
    (tmp_path / "runs" / "y" / "run.lock").write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                                                   "started": "then"}))
    out = launch()
    assert out.returncode == 2 and not (tmp_path / "cmd.txt").exists()
    assert out.stderr.strip() == (f"error: output_dir: runs/y is in use by another run (pid {os.getpid()} on this "
                                  f"host, started then); wait for it to finish, stop it, or choose another output_dir")
