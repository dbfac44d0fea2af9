"""Bad input through the real CLI: exit code 2, exactly one `error:` line on stderr naming the
file/key/value and what to do, no traceback, and no file created or changed anywhere in the
case directory (inputs and output dir alike)."""
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness import with_checkpoint
from harness import HERE, check_one_line_error, clone, diff, make_tokenizer, run_cli, snapshot
import cases


def _unpack(result):
    argv, expect, *rest = result
    return argv, expect, (rest[0] if rest else None)


@pytest.fixture(scope="module")
def fast_results(assets, tmp_path_factory):
    """Build every fast case, then run them through the CLI a few at a time, each forked from a process that has
    imported Paddle (tests/forkserver.py; tests/e2e/test_cli.py holds the error contract in fresh interpreters):
    name -> (proc, expect, dir, before)."""
    root = tmp_path_factory.mktemp("fast_cases")
    prepared = {}
    for name, build in sorted(cases.FAST.items()):
        d = clone(assets, root / name)
        if name in cases.SMALL_TOKENIZER_CASES:
            make_tokenizer(d / "small", vocab_size=270)
        argv, expect, env = _unpack(build(d))
        prepared[name] = (argv, expect, env, d, snapshot(d))
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        procs = {n: pool.submit(run_cli, a, d, env) for n, (a, _, env, d, _) in prepared.items()}
        return {n: (procs[n].result(), e, d, before) for n, (_, e, _, d, before) in prepared.items()}


@pytest.mark.parametrize("name", sorted(cases.FAST))
def test_fast_bad_input(name, fast_results):
    p, expect, d, before = fast_results[name]
    check_one_line_error(p.returncode, p.stdout, p.stderr, expect)
    assert diff(before, snapshot(d)) == []
    assert not (d / "pwned").exists()


@pytest.fixture(scope="module")
def paddle_results(assets, reference, tmp_path_factory):
    """Every checkpoint case in one interpreter (Paddle imported once): id -> (result, expect, dir, before)."""
    root = tmp_path_factory.mktemp("paddle_cases")
    batch, meta = [], {}
    for name, build in sorted(cases.PADDLE.items()):
        d = with_checkpoint(clone(assets, root / name), reference)
        argv, expect = build(d)
        batch.append({"id": name, "argv": argv, "cwd": str(d)})
        meta[name] = (expect, d, snapshot(d))
    (root / "cases.json").write_text(json.dumps(batch))
    import subprocess

    p = subprocess.run([sys.executable, str(HERE / "batch_cli.py"), str(root / "cases.json"), str(root / "out.json")],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    results = json.loads((root / "out.json").read_text())
    return {n: (results[n], *meta[n]) for n in meta}


@pytest.mark.parametrize("name", sorted(cases.PADDLE))
def test_checkpoint_bad_input(name, paddle_results):
    r, expect, d, before = paddle_results[name]
    check_one_line_error(r["rc"], r["stdout"], r["stderr"], expect)
    assert diff(before, snapshot(d)) == []



def test_skip_bad_lines_reports_and_counts(workdir):
    """--skip_bad_lines: each bad line is named (file:line) on stderr and counted in the summary and sidecar."""
    good = '{"text": "alpha beta gamma"}\n'
    (workdir / "in.jsonl").write_text(good + '{"text": "broken\n' + good + '{"body": 1}\n' + good)
    p = run_cli(["preprocess", "--input_path", "in.jsonl", "--output_prefix", "new/x", "--tokenizer", "tok",
                 "--skip_bad_lines"], cwd=workdir)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    assert "in.jsonl:2: not valid JSON" in p.stderr and "in.jsonl:4: no string field 'text'" in p.stderr
    assert "3 documents" in p.stdout and "2 bad lines skipped" in p.stdout
    assert json.loads((workdir / "new" / "x.json").read_text())["skipped_bad_lines"] == 2
