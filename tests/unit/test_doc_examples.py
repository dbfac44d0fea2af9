"""The worked examples in docs/PLAN.md print what `plan` prints: each `$ pretrain-cli plan ...` in a code block
is run on PaddleNLP's own file and its output compared line by line (`(...)` in the doc stands for the rest
of a parenthesis; `$ echo $?` for the exit status). On a failure the message is the output to paste."""
import re
import shlex
import shutil
from pathlib import Path

from pretrain_cli.cli import main as cli_main

REPO = Path(__file__).resolve().parents[2]
FILE = REPO / "tests" / "e2e" / "paddlenlp_configs" / "qwen_pretrain_argument_0p5b.json"


def _examples() -> list[tuple[list[str], list[str]]]:
    """[(argv, the lines the doc shows after it)] for every `$ pretrain-cli plan` in PLAN.md's code blocks."""
    out = []
    for block in re.findall(r"```\n(.*?)```", (REPO / "docs" / "PLAN.md").read_text(encoding="utf-8"), re.S):
        current = None
        for line in block.splitlines():
            if line.startswith("$ pretrain-cli plan "):
                current = (shlex.split(line[2:])[1:], [])
                out.append(current)
            elif current is not None:
                current[1].append(line)
    return out


def _matches(doc: str, got: str) -> bool:
    if "(...)" not in doc:
        return doc == got
    head = doc[:doc.index("(...)")]
    return got.startswith(head + "(") and got.endswith(")")


def test_plan_worked_examples_print_what_the_doc_shows(tmp_path, monkeypatch, capsys):
    examples = _examples()
    assert len(examples) >= 3  # the fused, unfused and 8-card examples
    shutil.copy(FILE, tmp_path / "pretrain_argument_0p5b.json")
    monkeypatch.chdir(tmp_path)
    for argv, shown in examples:
        capsys.readouterr()
        code = cli_main(argv)
        got = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
        want = [line for line in shown if line.strip()]
        if "$ echo $?" in want:
            at = want.index("$ echo $?")
            assert str(code) == want[at + 1], (argv, code)
            want = want[:at]
        assert len(got) == len(want) and all(_matches(w, g) for w, g in zip(want, got)), \
            f"docs/PLAN.md shows for `pretrain-cli {shlex.join(argv)}`:\n" + "\n".join(want) + \
            "\nbut it prints:\n" + "\n".join(got)
