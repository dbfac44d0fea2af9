"""Session fixtures: the tiny assets (tokenizer, token files, run.json) and one uninterrupted
reference training run whose checkpoints and final weights the other tests compare against."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import build_assets, clone, run_cli  # noqa: E402


@pytest.fixture(scope="session")
def assets(tmp_path_factory) -> Path:
    return build_assets(tmp_path_factory.mktemp("assets"))


@pytest.fixture(scope="session")
def reference(assets, tmp_path_factory) -> Path:
    """An uninterrupted run: out/checkpoint-{9,10} (10 is the last step) and the final out/model.safetensors."""
    d = clone(assets, tmp_path_factory.mktemp("reference") / "run")
    p = run_cli(["train", "run.json"], cwd=d)
    assert p.returncode == 0, p.stderr[-3000:]
    assert sorted(x.name for x in (d / "out").glob("checkpoint-*")) == ["checkpoint-10", "checkpoint-9"]
    return d


@pytest.fixture
def workdir(assets, tmp_path) -> Path:
    return clone(assets, tmp_path / "case")
