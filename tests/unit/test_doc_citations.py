"""Every file and section the docs, the README and the docstrings cite exists: links, repository paths,
`NAME.md` files, `NAME.md §N` sections, `NAME.md, "Title"` sections and `ARCHITECTURE.md facts: name`."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "src").rglob("*.py")),
           *sorted((REPO / "scripts").iterdir()), *sorted((REPO / "benchmarks").glob("*.py"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)#\s]+)(?:#[^)]*)?\)")
PATH = re.compile(r"(?<![\w./-])((?:docs|src|tests|scripts|configs|benchmarks)/[\w./-]*(?:\.[a-z]+\b|/))")
DOC = re.compile(r"(?<![\w/.-])([A-Z][A-Z_]*\.md)\b")
SECTION = re.compile(r"\b([A-Z][A-Z_]*\.md) §(\d+(?:\.\d+)?)")
TITLED = re.compile(r"\b([A-Z][A-Z_]*\.md), \"([^\"]+)\"")
FACT = re.compile(r"ARCHITECTURE\.md facts[:,]\s+\*?([A-Za-z0-9][\w .'/-]*?)\*?(?=[);,]|\.\s|\.$|\n|$)")


def _doc(name: str) -> Path | None:
    for where in (REPO / "docs" / name, REPO / name):
        if where.is_file():
            return where
    return None


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def test_every_cited_file_and_section_exists():
    facts = set(re.findall(r"^- \*([^*]+)\*", _text(REPO / "docs" / "ARCHITECTURE.md"), re.M))
    missing = []
    for src in SOURCES:
        if not src.is_file():
            continue
        text, where = _text(src), src.relative_to(REPO)
        for target in LINK.findall(text) if src.suffix == ".md" else []:
            if "://" not in target and not (src.parent / target).exists():
                missing.append(f"{where}: link {target}")
        for path in PATH.findall(text):
            path = path.rstrip(".")
            if "*" not in path and "<" not in path and not (REPO / path).exists() and not any(
                    (REPO / path).parent.glob((REPO / path).name + "*")):
                missing.append(f"{where}: path {path}")
        for name in DOC.findall(text):
            if _doc(name) is None:
                missing.append(f"{where}: file {name}")
        for name, number in SECTION.findall(text):
            doc = _doc(name)
            heading = re.compile(rf"^(?:#+ {re.escape(number)}[. ]|\*\*{re.escape(number)} )", re.M)
            if doc is not None and not heading.search(_text(doc)):
                missing.append(f"{where}: {name} §{number}")
        for name, title in TITLED.findall(text):
            doc = _doc(name)
            if doc is not None and not re.search(rf"^#+ .*{re.escape(title)}", _text(doc), re.M):
                missing.append(f'{where}: {name}, "{title}"')
        for fact in FACT.findall(text):
            if fact.strip() not in facts:
                missing.append(f"{where}: ARCHITECTURE.md facts: {fact.strip()}")
    assert not missing, "\n".join(missing)


def test_the_check_finds_what_it_looks_for():
    """The patterns match the citation forms in use (a pattern that matched nothing would pass vacuously)."""
    text = ("see [the guide](docs/PLAN.md), `src/pretrain_cli/cli.py`, docs/PERFORMANCE.md §3.3, DATA.md, \"Samples\""
            " and (ARCHITECTURE.md facts: fused ops) or (ARCHITECTURE.md facts, *uint16*).")
    assert LINK.findall(text) == ["docs/PLAN.md"]
    assert "src/pretrain_cli/cli.py" in PATH.findall(text)
    assert SECTION.findall(text) == [("PERFORMANCE.md", "3.3")]
    assert TITLED.findall(text) == [("DATA.md", "Samples")]
    assert FACT.findall(text) == ["fused ops", "uint16"]
    assert set(DOC.findall(text + " PADDLE_CPU.md")) == {"DATA.md", "ARCHITECTURE.md", "PADDLE_CPU.md"}
    assert _doc("DATA.md") is not None and _doc("PADDLE_CPU.md") is None  # a file the repository does not hold
