"""Multi-process tests through the real launcher: `python -m paddle.distributed.launch --nproc_per_node 2`.

One tiny corpus per session (random-walk token ids written straight to MMIDIDX, no tokenizer), the
`micro-qwen2` preset at seq 32, every run wrapped in a subprocess timeout, every rank's
`workerlog.N` read back. `launch` forks its ranks from processes that have imported Paddle (rank_shim.py: the
product's rank code, without ~4 CPU-s of interpreter start-up a rank); `launch(fresh=True)`, `launch_cmd` (the
tests that signal, stop or measure a rank themselves) and scripts/launch.sh start fresh ones.
"""
from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "run_pretrain.py"
SHIM = Path(__file__).resolve().parent / "rank_shim.py"  # a rank forked from a server (its docstring says how)
LOSS = re.compile(r"global_step: (\d+).*?\bloss: ([0-9.eE+-]+)|\bloss: ([0-9.eE+-]+),.*?global_step: (\d+)")

BASE = {
    "model_name_or_path": "micro-qwen2", "device": "cpu", "split": "98,2,0", "max_seq_length": 32,
    "per_device_train_batch_size": 4, "per_device_eval_batch_size": 2, "gradient_accumulation_steps": 1,
    "learning_rate": 0.002, "min_learning_rate": 0.0002, "lr_scheduler_type": "cosine", "warmup_steps": 2,
    "weight_decay": 0.01, "max_grad_norm": 1.0, "max_steps": 10, "logging_steps": 1, "save_steps": 1000,
    "do_train": True, "do_eval": False, "do_predict": False, "report_to": ["none"], "seed": 7,
    "overwrite_output_dir": True,
}


def write_corpus(prefix: Path, n_docs: int = 400, vocab: int = 512, seed: int = 0) -> None:
    """Learnable random-walk documents in the MMIDIDX layout (uint16, ARCHITECTURE.md facts: MMIDIDX v1)."""
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(n_docs):
        n = int(rng.integers(20, 120))
        steps = rng.choice([1, 2, 3], size=n)
        docs.append(((int(rng.integers(3, vocab)) + np.cumsum(steps)) % (vocab - 3) + 3).astype(np.uint16))
    sizes = np.array([len(d) for d in docs], "<i4")
    pointers = np.concatenate(([0], np.cumsum(sizes[:-1].astype(np.int64)) * 2)).astype("<i8")
    doc_idx = np.arange(len(docs) + 1, dtype="<i8")
    prefix.parent.mkdir(parents=True, exist_ok=True)
    with open(str(prefix) + ".bin", "wb") as f:
        for d in docs:
            f.write(d.astype("<u2").tobytes())
    with open(str(prefix) + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, len(docs), len(docs) + 1))
        f.write(sizes.tobytes() + pointers.tobytes() + doc_idx.tobytes())


_HELD = []  # port blocks this test process holds until it exits


def free_port() -> int:
    """A port for `--master` that no other launch on this host takes: the first port of a block held for the
    rest of this test process (`distributed.launcher.ports.reserve`; the launcher's own ports come from other blocks)."""
    from pretrain_cli.distributed.launcher.ports import reserve

    _HELD.append(reserve())
    return _HELD[-1].base


def job_pids(marker: str) -> dict:
    """{pid: (rank or None, parent pid, is a rank's command)} of every process whose environment carries
    `PCLI_JOB=<marker>` (set it in the launch's environment): the ranks and their watchers. /proc shows a process's
    environment and command line as they were at exec, so of a `launch` (forked ranks) this finds the shims
    (rank_shim.py), not the ranks they stand for; the tests that look ranks up start fresh ones (`launch_cmd`,
    scripts/launch.sh)."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
            parent = int(open(f"/proc/{pid}/stat", "rb").read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if f"PCLI_JOB={marker}".encode() in env:
            rank = [e.split(b"=", 1)[1] for e in env if e.startswith(b"PADDLE_TRAINER_ID=")]
            found[int(pid)] = (int(rank[0]) if rank else None, parent, b"run_pretrain.py" in cmd)
    return found


def rank_pid(marker: str, rank: int) -> int | None:
    """The pid of training rank `rank` of the job `marker` (`job_pids`), not its watcher: a fork of it, with the same
    command line and environment, whose parent is the rank."""
    found = {pid: parent for pid, (r, parent, trains) in job_pids(marker).items() if r == rank and trains}
    ranks = [pid for pid, parent in found.items() if parent not in found]
    return ranks[0] if ranks else None


def watcher_pid(marker: str, rank: int) -> int | None:
    """The pid of training rank `rank`'s watcher (`distributed.launcher.watchdog`): a fork of the rank, with its
    command line and environment, whose parent is the rank (`rank_pid`)."""
    parent = rank_pid(marker, rank)
    found = [pid for pid, (r, ppid, trains) in job_pids(marker).items() if r == rank and trains and ppid == parent]
    return found[0] if found else None


def child_env() -> dict:
    env = dict(os.environ)
    env.pop("PADDLE_TRAINER_ID", None)
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MKL_DEBUG_CPU_TYPE": "5",
                "PYTHONPATH": str(REPO / "src") + os.pathsep + env.get("PYTHONPATH", "")})
    return env


def write_config(path: Path, corpus: Path, output_dir: Path, **over) -> Path:
    cfg = dict(BASE, input_dir=str(corpus), output_dir=str(output_dir))
    cfg.update(over)
    path.write_text(json.dumps(cfg, indent=1))
    return path


def launch_cmd(cfg: Path, log_dir: Path, nproc: int = 2, extra=(), launcher=(), devices: str | None = None) -> list[str]:
    """The launcher over `nproc` CPU processes, or over the GPUs `devices` ("0,1") when given (tests/gpu)."""
    # the launcher holds its own block of rendezvous ports (scripts/job.py ports), as under scripts/launch.sh
    return [sys.executable, str(REPO / "scripts" / "job.py"), "ports", "--", sys.executable,
            *_launcher_args(cfg, log_dir, nproc, extra, launcher, devices)]


def _launcher_args(cfg: Path, log_dir: Path, nproc: int, extra=(), launcher=(), devices: str | None = None,
                   script=(str(SCRIPT),)) -> list[str]:
    procs = ["--devices", devices] if devices else ["--nproc_per_node", str(nproc)]
    return ["-m", "paddle.distributed.launch", *procs, "--log_dir", str(log_dir), *launcher, *script, str(cfg),
            *map(str, extra)]


class Run:
    def __init__(self, proc, log_dir: Path, seconds: float):
        self.returncode, self.stdout, self.stderr = proc.returncode, proc.stdout, proc.stderr
        self.log_dir, self.seconds = log_dir, seconds

    def log(self, n: int) -> str:
        p = self.log_dir / f"workerlog.{n}"
        return p.read_text(errors="replace") if p.is_file() else ""

    def losses(self, n: int = 0) -> dict[int, float]:
        return parse_losses(self.log(n))

    def explain(self) -> str:
        return (f"rc={self.returncode}\n--- launcher stdout\n{self.stdout[-3000:]}\n--- stderr\n{self.stderr[-3000:]}\n"
                + "".join(f"--- workerlog.{n}\n{self.log(n)[-3000:]}\n" for n in range(4) if self.log(n)))


def parse_losses(text: str) -> dict[int, float]:
    out = {}
    for line in text.splitlines():
        if "interval_runtime" not in line:
            continue
        step = re.search(r"global_step: (\d+)", line)
        loss = re.search(r"(?<![a-z_])loss: ([0-9.eE+-]+)", line)
        if step and loss:
            out[int(step.group(1))] = float(loss.group(1))
    return out


def _launched(cfg: Path, log_dir: Path, nproc: int, extra, launcher, timeout: float,
              fresh: bool, rank_script: Path = SCRIPT) -> subprocess.CompletedProcess:
    """`launch_cmd`'s run, holding a block of ports as `scripts/job.py ports` does, its launcher forked from a
    process that has imported Paddle (tests/forkserver.py, `spawns`: ~3 CPU-s a launch) and its ranks forked from
    two more (rank_shim.py: ~4 CPU-s a rank), or started afresh (`fresh`)."""
    import forkserver

    from pretrain_cli.distributed.launcher.ports import BLOCK_ENV, reserve

    held = reserve()
    try:
        env = dict(child_env(), PORT_RANGE=held.port_range, **{BLOCK_ENV: str(held.base)})
        script = (str(rank_script),) if fresh else (str(SHIM), forkserver.rank_servers(env), str(rank_script))
        return forkserver.run(_launcher_args(cfg, log_dir, nproc, extra, launcher, script=script),
                              cwd=str(log_dir.parent), env=env, timeout=timeout, spawns=True)
    finally:
        held.release()


def launch(cfg: Path, log_dir: Path, nproc: int = 2, extra=(), launcher=(), timeout: float = 120,
           fresh: bool = False, rank_script: Path = SCRIPT) -> Run:
    """One launch; once more when the ranks could not join the process group (exit 75: Paddle 3.3.1's gloo
    rendezvous of fleet's groups sometimes reads another group's address, docs/DISTRIBUTED.md), as
    scripts/launch.sh does. Its ranks are forked (rank_shim.py), or fresh interpreters with `fresh`. (`launch_cmd`,
    which tests start and signal themselves, and scripts/launch.sh always start fresh ones.) Each rank runs
    `rank_script CFG EXTRA...`: scripts/run_pretrain.py, or a measuring script of benchmarks/."""
    import shutil

    for attempt in range(2):
        start = time.perf_counter()
        proc = _launched(cfg, log_dir, nproc, extra, launcher, timeout, fresh, rank_script)
        run = Run(proc, log_dir, time.perf_counter() - start)
        if attempt or proc.returncode == 0 or "could not join the process group" not in run.explain():
            return run
        shutil.rmtree(log_dir, ignore_errors=True)
    return run


def launch_joined(cfg: Path, log_dir: Path, nproc: int, timeout: float = 300, tries: int = 3,
                  fresh: bool = False) -> Run:
    """`launch`, again (up to `tries` in all) when the processes could not join: Paddle 3.3.1's gloo rendezvous of
    fleet's groups sometimes reads another group's address or times out on a loaded machine, mostly for 4 ranks
    (docs/DISTRIBUTED.md); NCCL does not. Any other failure is returned at once."""
    import shutil

    for _ in range(tries):
        run = launch(cfg, log_dir, nproc=nproc, timeout=timeout, fresh=fresh)
        if run.returncode == 0 or "could not join the process group" not in run.explain():
            return run
        shutil.rmtree(log_dir, ignore_errors=True)
    return run


def single(cfg: Path, log_dir: Path, extra=(), timeout: float = 120) -> Run:
    """One process without the launcher (the reference run), its output saved as workerlog.0: `python
    scripts/run_pretrain.py CFG`, forked from a process that has imported Paddle (tests/forkserver.py) with the
    test process's threads."""
    import forkserver

    start = time.perf_counter()
    proc = forkserver.run([str(SCRIPT), str(cfg), *map(str, extra)], cwd=str(log_dir.parent), timeout=timeout)
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / "workerlog.0").write_text(proc.stdout + proc.stderr)
    return Run(proc, log_dir, time.perf_counter() - start)


def resume_from(ckpt: Path, corpus: Path, root: Path, nproc: int = 1, **over) -> Run:
    """A run of `over` resumed from checkpoint `ckpt` (one process, or `nproc` through the launcher), written under
    `root`; asserts it started and said so."""
    cfg = write_config(root / "resume.json", corpus, root / "resumed", resume_from_checkpoint=str(ckpt),
                       overwrite_output_dir=False, **over)
    run = single(cfg, root / "resume_log") if nproc == 1 else launch_joined(cfg, root / "resume_log", nproc)
    assert run.returncode == 0, run.explain()
    assert "resumed from" in run.log(0)
    return run


def reference(shared: Path, corpus: Path, timeout: float = 300, **keys) -> tuple[Run, Path]:
    """(Run, output_dir) of one process over `BASE` + `keys` (`single`), run once per test session under `shared`
    and keyed by `keys`: every module (and xdist worker) asking for the same one-process run reads the same one."""
    import hashlib

    from session_cache import built_once

    name = "single-" + hashlib.sha256(json.dumps(keys, sort_keys=True).encode()).hexdigest()[:12]

    def run_it(d: Path) -> None:
        run = single(write_config(d / "c.json", corpus, d / "out", **keys), d / "log", timeout=timeout)
        assert run.returncode == 0, run.explain()

    d = built_once(shared / name, run_it)
    return Run(subprocess.CompletedProcess([], 0, "", ""), d / "log", 0.0), d / "out"


def read_weights(directory: Path) -> dict:
    from safetensors.numpy import load_file

    out = {}
    for f in sorted(Path(directory).glob("*.safetensors")):
        if f.name.startswith("optimizer"):
            continue
        out.update(load_file(str(f)))
    return out


def read_checkpoint(ckpt: Path, kind: str = "optimizer") -> dict:
    """A checkpoint's whole tensors of `kind` ("weights" / "optimizer"), assembled from every rank's pieces."""
    from pretrain_cli.storage import checkpoint_index

    index = checkpoint_index.load(ckpt)
    assert index is not None, f"{ckpt}: no {checkpoint_index.INDEX}"
    reader = checkpoint_index.Reader(ckpt, index)
    return {n: reader.read(n) for n in reader.names(kind)}


STEPS = 10
TOL = 1e-5
# document masking, recompute and an evaluation every 5 steps (conftest's `doc_ref`: one process with them)
DOC = dict(attention_mask_type="document", recompute=True, do_eval=True, eval_steps=5, eval_iters=2)
# The exact gradient of a key bias is 0 (q·b_k shifts every score of a query row equally; softmax ignores
# that), so AdamW applies normalised rounding noise to it, whose sign depends on the summation order, and
# that order differs between one process at batch 8 and two at batch 4 by design. Compared loosely.
NOISE_ONLY, NOISE_TOL = ("self_attn.k_proj.bias",), 1e-3


def logged(log: str, name: str) -> dict[int, float]:
    """{step: the logged `name` (`mtp_loss`, `aux_loss`, ...)} of a rank's log (the step lines only)."""
    import re

    out = {}
    for line in log.splitlines():
        step, value = re.search(r"global_step: (\d+)", line), re.search(rf"\b{name}: ([0-9.eE+-]+)", line)
        if "interval_runtime" in line and step and value:
            out[int(step.group(1))] = float(value.group(1))
    return out


def expert_shares(log: str) -> list[str]:
    """Every step line's logged `moe_expert_share_per_layer` (the busiest expert's share per sparse layer), as text."""
    import re

    return re.findall(r"moe_expert_share_per_layer: (\[[^]]*\])", log)


def assert_close_losses(got: dict, want: dict, steps) -> None:
    for s in steps:
        assert s in got and s in want, (s, sorted(got), sorted(want))
        assert abs(got[s] - want[s]) <= TOL, f"step {s}: {got[s]} vs {want[s]}"


def assert_close_tensors(a: dict, b: dict, tol: float = TOL) -> float:
    """Every tensor within `tol` (key biases within NOISE_TOL); returns the largest difference outside those."""
    assert sorted(a) == sorted(b)
    worst = 0.0
    for k in a:
        diff = float(np.max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)))) if a[k].size else 0.0
        noise = any(n in k for n in NOISE_ONLY)
        assert diff <= (NOISE_TOL if noise else tol), f"{k}: max diff {diff}"
        worst = worst if noise else max(worst, diff)
    return worst


def assert_checkpoint_matches(ckpt: Path, want: Path, tol: float = TOL) -> None:
    """Checkpoint `ckpt`'s pieces assemble to `want`'s tensors, weights and AdamW state alike (the same names)."""
    for kind in ("weights", "optimizer"):
        saved, expected = read_checkpoint(ckpt, kind), read_checkpoint(want, kind)
        assert sorted(saved) == sorted(expected), kind
        assert_close_tensors(saved, expected, tol)


def evals(run: Run) -> list[tuple[str, str]]:
    """(eval_loss, eval_tokens) of every evaluation rank 0 logged."""
    return re.findall(r"eval_loss: ([0-9.]+),.*eval_tokens: (\d+)", run.log(0))
