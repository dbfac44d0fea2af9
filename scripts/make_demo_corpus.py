#!/usr/bin/env python
"""Build a small English corpus from text that ships with Python itself (no downloads).

Documents: the pydoc help topics (`pydoc_data.topics`) and the docstrings of the standard
library's modules, classes and functions, one JSON object per line: {"text": ...}.
Usage: python scripts/make_demo_corpus.py OUT.jsonl [--max_mb 4]
"""
import argparse
import ast
import json
import os
import sys
import sysconfig
from pathlib import Path


def docstrings(path: Path):
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
        return
    for node in [tree, *ast.walk(tree)]:
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc and len(doc) >= 200:
                yield doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--max_mb", type=float, default=4.0)
    ns = ap.parse_args()
    from pydoc_data.topics import topics

    budget = int(ns.max_mb * 2**20)
    out = Path(ns.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    size = docs = 0
    with open(tmp, "w", encoding="utf-8") as f:
        def emit(text: str) -> bool:
            nonlocal size, docs
            line = json.dumps({"text": text.strip()}, ensure_ascii=False) + "\n"
            f.write(line)
            size += len(line.encode())
            docs += 1
            return size < budget

        for key in sorted(topics):
            if not emit(topics[key]):
                break
        else:
            stdlib = Path(sysconfig.get_paths()["stdlib"])
            files = sorted(p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts and "test" not in p.parts)
            for path in files:
                if size >= budget or not all(emit(d) for d in docstrings(path)):
                    break
    os.replace(tmp, out)
    print(f"{out}: {docs} documents, {size / 2**20:.2f} MB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
