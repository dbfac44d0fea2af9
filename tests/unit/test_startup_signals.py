"""`train` holds SIGTERM back from its first line until Paddle's import has decided SIGTERM's
disposition (`start_signals.hold_stop_signals`), so every thread started meanwhile (numpy's OpenBLAS workers, in
`prepare`) blocks it too: a launcher's SIGTERM during Paddle's import ran the C++ handler that import installs on
such a thread (`FatalError: Termination signal` in the rank's log)."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
STOP = [int(signal.SIGTERM)]

# A thread that blocks SIGTERM itself (so the kernel gives it to another), waits until Paddle's import is well past
# its core, says how many native threads Python did not start, then signals the process as a launcher does.
STOP_IT = """import os, signal, sys, threading, time
def stop_it():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    while 'paddle.nn' not in sys.modules:
        time.sleep(0.001)
    print('native', len(os.listdir('/proc/self/task')) - threading.active_count(), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
threading.Thread(target=stop_it, daemon=True).start()
from pretrain_cli import cli
cli.main(['train', sys.argv[1]])
print('survived')
"""


def test_a_rank_with_openblas_threads_sigtermed_during_paddles_import_dies_quietly(tmp_path):
    """A rank (rank 1 of 2, no launcher's OMP_NUM_THREADS=1: OpenBLAS starts workers when `prepare` imports numpy)
    its launcher stops while it imports Paddle: it dies of the SIGTERM, without Paddle's FatalError report."""
    from data_helpers import write_tokens

    (tmp_path / "data").mkdir()
    write_tokens(tmp_path / "data" / "t")
    (tmp_path / "cfg.json").write_text(json.dumps({
        "model_name_or_path": "micro-qwen2", "device": "cpu", "input_dir": str(tmp_path / "data"),
        "output_dir": str(tmp_path / "out"), "max_seq_length": 16, "per_device_train_batch_size": 2,
        "max_steps": 2, "split": "100,0,0", "do_train": True, "report_to": ["none"]}))
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "PRETRAIN_CLI_THREADS")}
    env.update(PYTHONPATH=str(SRC), PADDLE_TRAINER_ID="1", PADDLE_TRAINERS_NUM="2", PADDLE_LOCAL_SIZE="2",
               PADDLE_LOCAL_RANK="1", OPENBLAS_NUM_THREADS="2")
    p = subprocess.run([sys.executable, "-c", STOP_IT, str(tmp_path / "cfg.json")], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    said = p.stdout[-2000:] + p.stderr[-3000:]
    assert p.returncode == -signal.SIGTERM, said
    assert "FatalError" not in p.stdout + p.stderr and "survived" not in p.stdout, said
    native = [int(line.split()[1]) for line in p.stdout.splitlines() if line.startswith("native ")]
    assert native and native[0] >= 1, said  # (OpenBLAS's workers were there to take the signal)


def test_a_signal_held_at_start_up_reaches_the_main_thread_once_released(tmp_path):
    """While held: a thread started then blocks SIGTERM for good (not SIGINT: a Ctrl-C acts at once), and a SIGTERM
    waits; released: it reaches the main thread, once, and ends the process by its default action (a fresh
    interpreter)."""
    code = ("import os, signal, threading, time\nfrom pretrain_cli import start_signals\n"
            "def blocked(tid):\n"
            "    line = [l for l in open(f'/proc/self/task/{tid}/status') if l.startswith('SigBlk:')][0]\n"
            "    mask = int(line.split()[1], 16)\n"
            "    return sorted(int(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP) if mask >> (s - 1) & 1)\n"
            "start_signals.hold_stop_signals()\nstart_signals.hold_stop_signals()\n"
            "t = threading.Thread(target=time.sleep, args=(30,), daemon=True)\nt.start()\n"
            "print(blocked(t.native_id), blocked(threading.get_native_id()), sep=';', flush=True)\n"
            "os.kill(os.getpid(), signal.SIGTERM)\ntime.sleep(0.2)\nprint('held', flush=True)\n"
            "start_signals.release_stop_signals()\ntime.sleep(0.5)\nprint('survived', flush=True)\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(SRC)},
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == -signal.SIGTERM, (p.returncode, p.stdout, p.stderr[-2000:])
    assert p.stdout.splitlines() == [f"{STOP};{STOP}", "held"], p.stdout


def test_train_ending_before_paddles_import_leaves_no_signal_held(monkeypatch):
    """`train` holds the stop signals while it prepares, and a run that ends there (a usage error) releases them."""
    from pretrain_cli import cli
    from pretrain_cli.errors import UserError
    from pretrain_cli.orchestration import prepare

    seen = []

    def refused(*args, **kwargs):
        seen.append(sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])))
        raise UserError("cfg.json: refused here")

    monkeypatch.setattr(prepare, "prepare", refused)
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    assert cli.main(["train", "cfg.json"]) == 2
    assert [[s for s in held if s in STOP] for held in seen] == [STOP]
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before
