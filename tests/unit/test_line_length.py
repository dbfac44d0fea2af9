"""House rule: no line of the source is over 120 characters. Nothing checked it (pyflakes does not, and no linter
config in the repository sets a length), so three lines of the package (152, 146 and 137 characters) were committed
unseen; and once this test read src/ only, 48 lines of scripts/*.py and benchmarks/*.py were over it, up to 1025
characters (scripts/gen_compat_doc.py:124, a row of the table it writes).
Read: the tracked .py files of src/ (every one), scripts/ and benchmarks/ (those directly in them: tests/ is not read).
Characters, not bytes: `awk 'length > 120'` under mawk counts bytes, so a line with a `×` or `—` in it is reported
over the limit when it is not."""
import subprocess
from pathlib import Path

LIMIT = 120
REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
TOP_LEVEL = ("scripts", "benchmarks")  # their own *.py files, not those of subdirectories


def _tracked(directory: Path, pattern: str = "*.py") -> list[Path]:
    """The tracked files of `directory` matching `pattern` (a git pathspec: `*.py` reaches subdirectories too), or
    every such file there where git cannot say (a copy without .git)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", pattern], cwd=directory, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return sorted(directory.rglob("*.py") if pattern == "*.py" else directory.glob("*.py"))
    return [directory / name for name in out.stdout.decode().split("\0") if name]


def _long(files: list[Path]) -> list[str]:
    return [f"{f.relative_to(REPO)}:{n}: {len(line)}" for f in files if f.is_file()
            for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1) if len(line) > LIMIT]


def test_no_source_line_is_over_120_characters():
    files = _tracked(SRC)
    assert any(f.name == "__init__.py" for f in files), files  # (git found the package's files)
    long = _long(files)
    assert not long, long


def test_no_line_of_the_scripts_or_benchmarks_is_over_120_characters():
    files = [f for d in TOP_LEVEL for f in _tracked(REPO / d, ":(glob)*.py")]
    assert {f.parent.name for f in files} == set(TOP_LEVEL), files  # (git found both directories' files)
    assert all(f.parent.parent == REPO for f in files), files  # (their own files only)
    long = _long(files)
    assert not long, long
