"""House rule: no line of the package's source is over 120 characters. Nothing checked it (pyflakes does not, and
no linter config in the repository sets a length), so two lines of 146 and 152 characters were committed unseen.
Characters, not bytes: `awk 'length > 120'` under mawk counts bytes, so a line with a `×` or `—` in it is
reported over the limit when it is not."""
import subprocess
from pathlib import Path

LIMIT = 120
SRC = Path(__file__).resolve().parents[2] / "src"


def _tracked() -> list[Path]:
    """The tracked .py files under src/ (every .py file under it where git cannot say: a copy without .git)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", "*.py"], cwd=SRC, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return sorted(SRC.rglob("*.py"))
    return [SRC / name for name in out.stdout.decode().split("\0") if name]


def test_no_source_line_is_over_120_characters():
    files = _tracked()
    assert any(f.name == "__init__.py" for f in files), files  # (git found the package's files)
    long = [f"{f.relative_to(SRC)}:{n}: {len(line)}" for f in files if f.is_file()
            for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1) if len(line) > LIMIT]
    assert not long, long
