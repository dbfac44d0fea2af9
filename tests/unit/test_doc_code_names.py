"""Every module, class, function or attribute of pretrain-cli that README.md and docs/*.md name in backticks exists
where they say: `orchestration.targets.launcher_target`, `FleetHybrid.step` in `distributed/strategies/strategy.py`,
`storage/shard_files.cast`. A name is checked from its first part that is one of the package's modules (a file:
`prepare`, `steps.order`, `local_kernels`); the rest must be defined there (a function, class or assignment, a
class's method or attribute; a lower-case name may also be a field or method of one of its classes, as in
`kernels.rope` for the `Kernels` object), not merely imported. Dotted paths that start elsewhere (`RunConfig.parallel...`,
a JSON key path such as `layout.axes.ep`) are not module references and are left alone."""
import ast
import re
from functools import lru_cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "pretrain_cli"
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TOKEN = re.compile(r"`([^`\n]+)`")
NAME = re.compile(r"(?<![\w./-])((?:[a-z_][a-z0-9_]*/)*[a-z_][a-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+)(?![\w/(-])")
SUFFIXES = ("json", "md", "py", "sh", "bin", "idx", "jsonl", "safetensors", "png", "txt", "so", "gz", "zst", "lsm",
            "npy", "npz", "cc", "h", "toml", "yaml", "yml", "log", "tmp", "lock", "parquet", "bz2", "xz", "zstd", "pdparams")


def _modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] != "__init__":
            out[".".join(parts)] = path
    return out


MODULES = _modules()


@lru_cache(maxsize=None)
def _defined(path: Path) -> dict[str, set[str]]:
    """Top-level names defined in `path` (def, class, assignment), each with what its class defines."""
    out: dict[str, set[str]] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = set()
        elif isinstance(node, ast.ClassDef):
            members = out.setdefault(node.name, set())
            for sub in ast.walk(node):
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    members.add(sub.name)
                elif isinstance(sub, ast.AnnAssign) and isinstance(sub.target, (ast.Name, ast.Attribute)):
                    members.add(getattr(sub.target, "id", None) or sub.target.attr)
                elif isinstance(sub, ast.Assign):
                    members.update(getattr(t, "id", None) or getattr(t, "attr", "") for t in sub.targets)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        out.setdefault(name.id, set())
    return out


def problem(reference: str) -> str | None:
    """Why `reference` (`a.b.c`, or `a/b.c` as a file path and a name) does not resolve, or None (also when it is
    no module reference at all)."""
    dotted = reference.replace("/", ".").removeprefix("src.").removeprefix("pretrain_cli.")
    parts = dotted.split(".")
    if parts[-1] in SUFFIXES:
        return None
    for i in range(len(parts), 0, -1):
        prefix = ".".join(parts[:i])
        found = [m for m in MODULES if m == prefix or m.endswith("." + prefix)]
        if found:
            rest = parts[i:]
            if not rest:
                return None
            for module in found:
                names = _defined(MODULES[module])
                if rest[0] in names and (len(rest) == 1 or rest[1] in names[rest[0]] or not names[rest[0]]):
                    return None
                if rest[0][0].islower() and any(rest[0] in members for members in names.values()):
                    return None  # a field or method of an object of the module (`kernels.rope`, `comm.agree_on_resume`)
            return f"{'.'.join(rest)} is not defined in {', '.join(str(MODULES[m].relative_to(SRC.parents[1])) for m in found)}"
    return None


def test_every_code_name_the_docs_give_exists():
    missing = []
    for doc in DOCS:
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for token in TOKEN.findall(line):
                for reference in NAME.findall(token):
                    reason = problem(reference)
                    if reason:
                        missing.append(f"{doc.relative_to(REPO)}:{number}: `{reference}`: {reason}")
    assert not missing, "\n".join(missing)


def test_the_check_finds_what_it_looks_for():
    """Names that are there pass, renamed ones fail, non-module paths are left alone."""
    assert problem("orchestration.targets.launcher_target") is None
    assert problem("distributed/strategies/strategy.FleetHybrid.step") is None
    assert problem("storage/shard_files.cast") is None
    assert problem("steps.order.STEPS") is None
    assert "launcher_target is not defined" in problem("orchestration.prepare.launcher_target")
    assert "Pipeline.step is not defined" in problem("distributed/strategies/pipeline.Pipeline.step")
    assert problem("kernels.rope") is None and problem("comm.agree_on_resume") is None
    assert problem("RunConfig.parallel.vocab_parallel") is None  # not a module path: left alone
    assert problem("demo/output/args.json") is None
