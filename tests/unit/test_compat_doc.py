"""docs/COMPATIBILITY.md lists every key and is generated from the dataclasses."""
import importlib.util
from pathlib import Path

from pretrain_cli.config.keys import KEYS

REPO = Path(__file__).resolve().parents[2]


def test_compatibility_doc_is_current_and_complete():
    spec = importlib.util.spec_from_file_location("gen", REPO / "scripts" / "gen_compat_doc.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    text = (REPO / "docs" / "COMPATIBILITY.md").read_text()
    assert text == gen.render(), "run `python scripts/gen_compat_doc.py`"
    for key in KEYS:
        assert f"| `{key}` |" in text
