"""Shared test setup: the CPU math environment before any Paddle import, and small fixtures."""
import os
import sys
from pathlib import Path

import pytest

from pretrain_cli import runtime

runtime.setup_env()

REPO = Path(__file__).resolve().parents[1]


def run_cli(*argv, cwd=None, env=None, timeout=600):
    """Run `pretrain-cli` in a subprocess; returns CompletedProcess with text stdout/stderr."""
    import subprocess

    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "pretrain_cli", *map(str, argv)], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def repo():
    return REPO


@pytest.fixture(name="run_cli")
def run_cli_fixture():
    """`run_cli(*argv, cwd=None, env=None, timeout=600)` → CompletedProcess of `python -m pretrain_cli`."""
    return run_cli



# scripts/test.sh runs the suite on two pytest-xdist workers (`-n 2`): one work unit per test module, so
# module fixtures are built once. Every test that starts several processes of its own (the real launcher,
# whose ranks need both cores) is one unit, run in order on one worker; the robustness tests are one unit
# too, as they share one reference training run (a session fixture, built per worker). The units are set
# here rather than by xdist_group marks: pytest 9 ignores the test-id suffix that `--dist loadgroup` relies on.
_GROUPS = {"distributed": "multi-process", "robustness": "robustness"}


def _work_unit(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0].removeprefix("tests/")
    return _GROUPS.get(path.split("/", 1)[0], path)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _work_unit(nodeid)

    return ByWorkUnit(config, log)
