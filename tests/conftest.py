"""Shared test setup: the CPU math environment before any Paddle import, and small fixtures."""
import os
import sys
from pathlib import Path

import pytest

from pretrain_cli import runtime

# Two pytest workers on two cores, each test process with two OpenMP threads, beside launched ranks: Intel OpenMP's
# threads spin 200 ms after each parallel region by default (KMP_BLOCKTIME), time another process could compute
# in. Set before any Paddle import, so every process the suite starts (forked or fresh) inherits it: 7-10 % less CPU
# for the same tests (test_perf_equivalence, the test_moe files and test_hf_parity on 2 workers: 87 -> 79-82 CPU-s).
# Numerics are unchanged; the product's own runs keep the default, which suits one process owning the cores.
os.environ.setdefault("KMP_BLOCKTIME", "0")
runtime.setup_env()

# Every process the suite starts (each launched rank, each fresh interpreter: hundreds) imports the package from its
# sources. Where PYTHONDONTWRITEBYTECODE is set (this CI sandbox sets it) no bytecode is ever written, so each of them
# compiles every module again (~0.2-0.4 CPU-s a process); the suite's children write theirs under one prefix instead
# (never into the source tree) and the next process reads it.
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
    import tempfile

    prefix = os.path.join(tempfile.gettempdir(), f"pretrain-cli-pycache-{os.getuid()}")
    os.environ.setdefault("PYTHONPYCACHEPREFIX", prefix)

REPO = Path(__file__).resolve().parents[1]


def run_cli(*argv, cwd=None, env=None, timeout=600):
    """`python -m pretrain_cli ARGV` (forked from a process that has imported Paddle: tests/forkserver.py);
    returns CompletedProcess with text stdout/stderr."""
    import forkserver

    full_env = dict(os.environ)
    full_env.update(env or {})
    return forkserver.run(["-m", "pretrain_cli", *argv], cwd=cwd, env=full_env, timeout=timeout)


@pytest.fixture
def repo():
    return REPO


@pytest.fixture(name="run_cli")
def run_cli_fixture():
    """`run_cli(*argv, cwd=None, env=None, timeout=600)` → CompletedProcess of `python -m pretrain_cli`."""
    return run_cli



# scripts/test.sh runs the suite on two pytest-xdist workers (`-n 2`): one work unit per test module, so
# module fixtures are built once. The tests that start several processes of their own (the real launcher) are two
# units, each run in order on one worker, and both start first, one on each worker: a launch keeps its two cores
# only ~40-60 % busy (its ranks wait on each other and on the launcher), so two launch units side by side fill the
# machine, and the many short modules come last, where they share both workers evenly (started last, the second
# launch unit ran alone for the suite's last ~4 minutes at ~50 % of the cores, measured from /proc/stat). The
# robustness tests are one unit too, as they share one reference training run (a session fixture, built per
# worker). The units are set here rather than by xdist_group marks: pytest 9 ignores the test-id suffix that
# `--dist loadgroup` relies on.
_GROUPS = {"distributed": "multi-process", "robustness": "robustness"}
_SECOND = ("distributed/test_context.py", "distributed/test_sequence_parallel.py", "distributed/test_tp_pipeline.py",
           "distributed/test_context_products.py", "distributed/test_resilience.py", "distributed/test_layouts.py",
           "distributed/test_moe_context_pipeline.py", "distributed/test_mtp_context.py", "distributed/test_mtp_dense.py",
           "distributed/test_launch_failures.py")
# (the two units: ~540 and ~510 s of the 2-core machine's time at 6813b8f; the MoE/MTP-under-cp and dense-MTP modules
# since, ~190 s alone at 3 steps a launch: ~70 s of them in the first, ~120 s in the second; launch.sh's failure
# lines, ~80 s alone, in the second)
# The longest units first, by their time in the suite (xdist hands a worker its next unit when its current one is
# nearly done), so the short modules even out the end: left in file order, test_perf_equivalence (~70 s) and the
# plan modules came last and one worker finished them alone; xdist's own order (most tests first) started the
# 3-test calibration module last.
_LONGEST_FIRST = ("multi-process", "multi-process-2", "unit/test_plan_calibration.py", "robustness",
                  "unit/test_perf_equivalence.py", "e2e/test_train.py", "e2e/test_train_checkpoints.py", "e2e/test_cli.py", "unit/test_plan_startup.py",
                  "unit/test_plan_doc.py", "unit/test_presets.py", "parity/test_deepseek_parity.py",
                  "e2e/test_readme.py", "unit/test_cpu_ops_build.py", "unit/test_moe_router.py")


def _work_unit(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0].removeprefix("tests/")
    if path in _SECOND:
        return "multi-process-2"
    return _GROUPS.get(path.split("/", 1)[0], path)


def pytest_collection_modifyitems(items):
    rank = {unit: i for i, unit in enumerate(_LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(_work_unit(item.nodeid), len(_LONGEST_FIRST)))  # stable: the rest keep order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _work_unit(nodeid)

    config.option.loadscopereorder = False  # the units in collection order: _LONGEST_FIRST
    return ByWorkUnit(config, log)
