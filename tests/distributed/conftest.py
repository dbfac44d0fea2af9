"""The session corpus for the multi-process tests (helpers: launch_helpers.py)."""
from pathlib import Path

import pytest

from launch_helpers import single, write_config, write_corpus


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("dist_corpus")
    write_corpus(root / "data" / "walk")
    return root / "data"


@pytest.fixture(scope="session")
def ref(corpus, tmp_path_factory):
    """One process, per-device batch 8 = global batch 8; saves checkpoint-5: the reference every layout matches."""
    root = tmp_path_factory.mktemp("ref")
    cfg = write_config(root / "ref.json", corpus, root / "out", per_device_train_batch_size=8, save_steps=5)
    run = single(cfg, root / "log")
    assert run.returncode == 0, run.explain()
    return run, root / "out"
