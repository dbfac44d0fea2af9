"""A small real corpus (Python's own docs), a tokenizer and token files, built once per test session."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pretrain_cli.cli import main as cli_main

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """Built once per test session, whichever xdist worker asks first (tests/session_cache.py)."""
    from session_cache import built_once, shared_dir

    def build(root):
        subprocess.run([sys.executable, str(REPO / "scripts" / "make_demo_corpus.py"), str(root / "corpus.jsonl"),
                        "--max_mb", "0.4"], check=True, capture_output=True)
        assert cli_main(["train-tokenizer", "--input_path", str(root / "corpus.jsonl"), "--output_dir",
                         str(root / "tokenizer"), "--vocab_size", "512"]) == 0
        assert cli_main(["preprocess", "--input_path", str(root / "corpus.jsonl"), "--output_prefix",
                         str(root / "data" / "docs"), "--tokenizer", str(root / "tokenizer"), "--append_eos"]) == 0

    return built_once(shared_dir(tmp_path_factory) / "e2e_corpus", build)
