"""The session corpus and the one-process references of the multi-process tests (helpers: launch_helpers.py).

Each is built once per test session, not once per xdist worker or module (tests/session_cache.py), and a reference
is keyed by its configuration (`launch_helpers.reference`): modules asking for the same one-process run share it."""
from pathlib import Path

import pytest
from session_cache import built_once, shared_dir

from launch_helpers import DOC, reference, write_corpus


@pytest.fixture(scope="session")
def shared(tmp_path_factory) -> Path:
    return shared_dir(tmp_path_factory) / "distributed"


@pytest.fixture(scope="session")
def corpus(shared) -> Path:
    return built_once(shared / "corpus", lambda d: write_corpus(d / "data" / "walk")) / "data"


@pytest.fixture(scope="session")
def ref(corpus, shared):
    """One process, per-device batch 8 = global batch 8; saves checkpoint-5: the reference every layout matches."""
    return reference(shared, corpus, per_device_train_batch_size=8, save_steps=5)


@pytest.fixture(scope="session")
def doc_ref(corpus, shared):
    """`ref` with packed documents, recompute and evaluation (`DOC`); saves checkpoint-5."""
    return reference(shared, corpus, per_device_train_batch_size=8, save_steps=5, **DOC)
