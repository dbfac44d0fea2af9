"""Test-only fault injection, active only when PCLI_FAULT is set (the robustness tests put this
directory on PYTHONPATH). No product code knows about it.

PCLI_FAULT = "<point>:<n>[,<point>:<n>...]": the n-th time (1-based) the process reaches <point>:

  forward            CausalLM.forward is entered                          -> SIGKILL
  opt_step           the optimizer step has updated the weights           -> SIGKILL
                     (paddle.optimizer.AdamW.step, or the fused CPU AdamW of pretrain_cli.training.optim)
  save_weights       a model*.safetensors file is half written            -> SIGKILL
  save_optimizer     an optimizer*.safetensors file is half written       -> SIGKILL
  enospc             an optimizer*.safetensors file is half written       -> raise OSError(ENOSPC)
  enospc_weights     a model*.safetensors file is half written            -> raise OSError(ENOSPC)
  save_stall         a safetensors file of a save is about to be written  -> says `save_stall: writing <file>` on
                                                                             stderr, then sleeps PCLI_STALL_SECONDS
                                                                             (default an hour: a stalled file system;
                                                                             with async_save only the background
                                                                             writer waits)
                     (every safetensors file the product writes goes through pretrain_cli.storage.shard_files.write)
  publish            os.replace(... -> checkpoint-N) is about to run       -> SIGKILL
  curve_rename       os.replace(... -> loss_curve.png) is about to run on  -> SIGKILL
                     the main thread (the final export's drawing; the
                     checkpoints' drawings run on a background thread)
  rotate             shutil.rmtree(*.deleting) has removed one file        -> SIGKILL
  preprocess_batch   IndexedDatasetWriter.add_documents has written a batch -> SIGKILL
  preprocess_rename  os.replace(... -> *.idx) is about to run              -> SIGKILL
  join_stall         a launched rank is about to mark itself in the join   -> sleeps an hour: a start-up stalled
                     of the process group (distributed.setup's `joining`     before the join (its node's launcher
                     record, pretrain_cli.distributed.launcher.job.record)   beats on)

PCLI_FAULT_RANK = "<r>": the faults act only in launched rank r (PADDLE_TRAINER_ID), not in the other ranks or the
launcher that share the environment.
PCLI_HOSTNAME = "<name>": the host name a launched rank's watcher knows it by (`watchdog.start`'s, not gloo's), so two
nodes launched on this machine are two hosts to the watchers (each watches only its own host's ranks).

Modules are patched right after they are first imported (a meta-path finder wraps their
loader), so the product imports them exactly as usual; a module already imported (a run forked from
tests/forkserver.py, which runs this file before the CLI) is patched on the spot. Every patch replaces a
module or class attribute, which the product looks up at call time.
"""
import errno
import importlib.abc
import importlib.util
import os
import re
import signal
import sys
import threading

_SPEC = os.environ.get("PCLI_FAULT", "")
_TARGETS = dict(item.split(":") for item in _SPEC.split(",") if item)
_COUNTS = {}
_RANK = os.environ.get("PCLI_FAULT_RANK")
_HOST = os.environ.get("PCLI_HOSTNAME")


def _hit(point: str) -> bool:
    if point not in _TARGETS or (_RANK is not None and os.environ.get("PADDLE_TRAINER_ID") != _RANK):
        return False
    _COUNTS[point] = _COUNTS.get(point, 0) + 1
    return _COUNTS[point] == int(_TARGETS[point])


def _die():
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _patch_shard_files(mod):
    original = mod.write

    def write(path, entries, metadata=None):
        if _hit("save_stall"):
            import time

            print(f"save_stall: writing {os.fspath(path)}", file=sys.stderr, flush=True)
            time.sleep(float(os.environ.get("PCLI_STALL_SECONDS", "3600")))
        optimizer = os.path.basename(os.fspath(path)).startswith("optimizer")
        kill = _hit("save_optimizer" if optimizer else "save_weights")
        full = _hit("enospc" if optimizer else "enospc_weights")
        if kill or full:
            tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
            original(tmp, entries, metadata)
            with open(tmp, "r+b") as f:  # half of it reached the disk
                f.truncate(os.path.getsize(tmp) // 2)
            if kill:
                _die()
            os.remove(tmp)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return original(path, entries, metadata)

    mod.write = write


def _patch_decoder(mod):
    original = mod.CausalLM.forward

    def forward(self, *a, **kw):
        if _hit("forward"):
            _die()
        return original(self, *a, **kw)

    mod.CausalLM.forward = forward


def _patch_optimizer(mod):
    original = mod.AdamW.step

    def step(self, *a, **kw):
        out = original(self, *a, **kw)
        if _hit("opt_step"):
            _die()
        return out

    mod.AdamW.step = step


def _patch_fused_optimizer(mod):
    _patch_optimizer(type("Mod", (), {"AdamW": mod.FusedAdamW}))


def _patch_indexed(mod):
    original = mod.IndexedDatasetWriter.add_documents

    def add_documents(self, *a, **kw):
        out = original(self, *a, **kw)
        if _hit("preprocess_batch"):
            self._bin.flush()
            _die()
        return out

    mod.IndexedDatasetWriter.add_documents = add_documents


def _patch_job(mod):
    import time

    original = mod.record

    def record(rank, code, kind, *a, **kw):
        if kind == "joining" and _hit("join_stall"):
            time.sleep(3600)
        return original(rank, code, kind, *a, **kw)

    mod.record = record


def _patch_watchdog(mod):
    import socket

    original = mod.start

    def start(*a, **kw):
        real = socket.gethostname
        socket.gethostname = lambda: _HOST
        try:
            return original(*a, **kw)
        finally:
            socket.gethostname = real

    mod.start = start


_PATCHES = {
    "pretrain_cli.models.decoder": _patch_decoder,
    "paddle.optimizer": _patch_optimizer,
    "pretrain_cli.training.optim": _patch_fused_optimizer,
    "pretrain_cli.storage.shard_files": _patch_shard_files,
    "pretrain_cli.data.indexed_writer": _patch_indexed,
    "pretrain_cli.distributed.launcher.job": _patch_job,
}


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _PATCHES:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _PATCHES[name](module)

        spec.loader.exec_module = exec_and_patch
        return spec


def _install_os_patches():
    import shutil

    replace, rmtree = os.replace, shutil.rmtree

    def patched_replace(src, dst, *a, **kw):
        name = os.path.basename(os.fspath(dst))
        if re.fullmatch(r"checkpoint-\d+", name) and not os.fspath(src).endswith(".deleting") and _hit("publish"):
            _die()
        if name.endswith(".idx") and _hit("preprocess_rename"):
            _die()
        if (name == "loss_curve.png" and threading.current_thread() is threading.main_thread()
                and _hit("curve_rename")):
            _die()
        return replace(src, dst, *a, **kw)

    def patched_rmtree(path, *a, **kw):
        if os.fspath(path).endswith(".deleting") and _hit("rotate"):
            for dirpath, _, files in os.walk(path):
                if files:
                    os.remove(os.path.join(dirpath, files[0]))
                    break
            _die()
        return rmtree(path, *a, **kw)

    os.replace = patched_replace
    shutil.rmtree = patched_rmtree


if _HOST:
    _PATCHES["pretrain_cli.distributed.launcher.watchdog"] = _patch_watchdog
if _TARGETS or _HOST:
    for _name, _patch in _PATCHES.items():
        if _name in sys.modules:
            _patch(sys.modules[_name])
    sys.meta_path.insert(0, _Finder())
if _TARGETS:
    _install_os_patches()
