"""The session corpus for the multi-process tests (helpers: launch_helpers.py)."""
from pathlib import Path

import pytest

from launch_helpers import write_corpus


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("dist_corpus")
    write_corpus(root / "data" / "walk")
    return root / "data"
