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
