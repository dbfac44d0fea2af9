"""Every rank of a launch runs the same run, in the same `output_dir`: checked once the process group is joined, before
any rank builds a model.

Each node reads its own argument file and `--key` overrides, so nodes started by hand can disagree. Ranks that
built models of other shapes met in their first collective and gloo ended both after 30 s (`TIMEOUT`, a traceback,
"re-run to resume"); ranks that read another `max_seq_length` or other token files trained together without a word,
each on its own data, and rank 0's args.json described only its own. An `output_dir` that is not one directory on
every node (each node's own disk) made rank 0 wait for the other ranks' checkpoint files, which never came into its
directory, until the watchdog called the job hung.

So each rank publishes in the launcher's TCP store what it runs (`RunSpec.fingerprint`: the arguments without their
paths, which may differ between nodes, and what the paths hold: the model's config.json, the tokenizer's size, the
token files' documents and tokens) and whose run lock it sees in its `output_dir` (rank 0 took it before joining:
`training.run_lock`). Every other rank compares itself with rank 0 and publishes its finding; rank 0 publishes the
first one; every rank raises that same line (`UserError`, exit 2: launch.sh never retries it). Store traffic is
O(world).

The fingerprint holds the arguments as the user set them, not as a resume set them: only rank 0 chooses the checkpoint
to resume (it alone verifies them and skips a damaged one), and what a run keeps from it (the global batch on another
number of data ranks, through the keys that sets) follows from that choice. The other ranks choose none before
joining and take rank 0's checkpoint, and decide what they keep from it, once this check passed (`resume`). Before,
they took the newest checkpoint unverified: with a damaged one rank 0 skipped, trained on another number of data
ranks, their accumulation differed from rank 0's and this check refused the launch (a missing config.json in it
stopped them in `prepare`).
"""
from __future__ import annotations

import json
import socket
import time
from pathlib import Path

from pretrain_cli.errors import UserError
from pretrain_cli.training import run_lock

SEE_SECONDS = 10.0  # how long a rank looks for rank 0's run lock (a shared file system's directory cache may lag)
SHOWN = 3  # differing keys named in the line


def check(comm, fingerprint: dict, output_dir) -> None:
    """Raise, on every rank, one line naming the first rank whose run differs from rank 0's, or whose `output_dir`
    is not rank 0's; nothing with one process."""
    if comm.world <= 1:
        return
    me = comm.rank
    mine = {"host": socket.gethostname(), "fingerprint": fingerprint, "output_dir": str(output_dir),
            "lock": _holder(output_dir, None)}
    comm.publish(f"run/{me}", json.dumps(mine, default=str))  # (keys in order: the arguments first)
    if me != 0:
        first = json.loads(comm.read("run/0"))
        if first["lock"] is not None and not run_lock.same_holder(mine["lock"], first["lock"]):
            mine["lock"] = _holder(output_dir, first["lock"])
        comm.publish(f"finding/{me}", difference(me, mine, first) or "")
        verdict = comm.read("finding")
        comm.tally("finding/read", 1)
    else:
        verdict = next((f for f in (comm.read(f"finding/{r}") for r in range(1, comm.world)) if f), "")
        comm.publish("finding", verdict)
        deadline = time.monotonic() + SEE_SECONDS * 3
        while verdict and comm.tally("finding/read") < comm.world - 1 and time.monotonic() < deadline:
            time.sleep(0.05)  # the store lives in this process: it stays until every rank has read the finding
    if verdict:
        raise UserError(verdict)


def resume(comm, spec):
    """`spec` (the prepared `RunSpec`) resuming the checkpoint rank 0 chose, with what the run keeps from it decided
    for that checkpoint as rank 0 decided it (`RunSpec.resuming`); `spec` itself on rank 0 and with one process."""
    chosen = comm.agree_on_resume(spec.resume if comm.rank == 0 else None)
    return spec if chosen == spec.resume else spec.resuming(chosen)


def _holder(output_dir, expected: dict | None) -> dict | None:
    """The run lock this rank sees in `output_dir` (None: none); with `expected` (rank 0's), looked for again for up
    to SEE_SECONDS until it is that one."""
    deadline = time.monotonic() + (SEE_SECONDS if expected is not None else 0)
    while True:
        seen = run_lock.holder(output_dir)
        if expected is None or run_lock.same_holder(seen, expected) or time.monotonic() >= deadline:
            return seen
        time.sleep(0.2)


def difference(rank: int, mine: dict, first: dict) -> str | None:
    """The line for `rank`'s run (`mine`) against rank 0's (`first`), or None when they are the same run."""
    who, them = f"rank {rank} (host {mine['host']})", f"rank 0 (host {first['host']})"
    a, b = mine["fingerprint"], first["fingerprint"]
    keys = [k for k in dict.fromkeys([*b, *a]) if a.get(k) != b.get(k)]
    if keys:
        shown = "; ".join(_differs(k, a.get(k), b.get(k)) for k in keys[:SHOWN])
        more = f"; and {len(keys) - SHOWN} more" if len(keys) > SHOWN else ""
        return (f"{who} runs another configuration than {them}: {shown}{more}; start every node with the same "
                f"argument file, --key overrides, model, tokenizer and token files")
    if first["lock"] is not None and not run_lock.same_holder(mine["lock"], first["lock"]):
        seen = "no run lock" if mine["lock"] is None else f"another run's lock ({run_lock.describe(mine['lock'])})"
        return (f"output_dir: {who} sees {seen} in {Path(mine['output_dir']) / run_lock.LOCK_FILE}, not the one "
                f"{them} holds in {Path(first['output_dir']) / run_lock.LOCK_FILE}: the nodes do not share "
                f"output_dir; put it on a file system every node mounts (checkpoints are written there by every "
                f"rank, and resumed from there)")
    return None


def _differs(key: str, value, first) -> str:
    if isinstance(value, dict) and isinstance(first, dict):  # the model's config.json: its differing keys
        inner = [k for k in sorted(set(value) | set(first)) if value.get(k) != first.get(k)]
        return f"{key}: " + ", ".join(f"{k} {_show(value.get(k))} (rank 0: {_show(first.get(k))})"
                                      for k in inner[:SHOWN])
    if isinstance(value, list) and isinstance(first, list):  # the token files' lines: the first that differs
        pairs = [(v, f) for v, f in zip(value + [None] * len(first), first + [None] * len(value)) if v != f]
        value, first = pairs[0] if pairs else (value, first)
    return f"{key} {_show(value)} (rank 0: {_show(first)})"


def _show(value) -> str:
    return "unset" if value is None else json.dumps(value) if not isinstance(value, str) else repr(value)
