"""The package's folders are its layers: lower layers never import higher ones, and nothing imports in a circle.

Every `import` counts, including those inside functions (a lazy import is still a dependency).
"""
import ast
from pathlib import Path

import pretrain_cli

ROOT = Path(pretrain_cli.__file__).parent
# __main__ -> cli -> commands -> config -> training -> {planning, distributed} -> {models, data} -> ops -> the base modules
LAYER = {"__main__": 8, "cli": 7, "commands": 7, "config": 6, "training": 5, "planning": 4, "distributed": 4,
         "models": 3, "data": 3, "ops": 2, "errors": 1, "runtime": 1, "atomic": 1, "run_dir": 1, "__init__": 1}


def _modules() -> dict[str, set[str]]:
    """module name -> the pretrain_cli modules it imports."""
    graph = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        name = ".".join(("pretrain_cli", *rel.parts)).removesuffix(".__init__")
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pretrain_cli"):
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    deps.add(sub if (ROOT.joinpath(*sub.split(".")[1:]).with_suffix(".py").is_file()
                                     or ROOT.joinpath(*sub.split(".")[1:]).is_dir()) else node.module)
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("pretrain_cli")}
        graph[name] = {d for d in deps if d != name}
    return graph


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_lower_layers_never_import_higher_ones():
    bad = []
    for module, deps in _modules().items():
        for dep in deps:
            a, b = _top(module), _top(dep)
            if a != b and (LAYER[b] > LAYER[a] or (LAYER[b] == LAYER[a] and LAYER[a] > 1)):
                bad.append(f"{module} ({a}, layer {LAYER[a]}) imports {dep} ({b}, layer {LAYER[b]})")
    assert not bad, "\n".join(sorted(bad))


def test_no_import_circles():
    graph = _modules()
    seen, stack, cycles = set(), [], []

    def visit(node):
        if node in stack:
            cycles.append(stack[stack.index(node):] + [node])
            return
        if node in seen:
            return
        seen.add(node)
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if dep in graph:
                visit(dep)
        stack.pop()

    for module in sorted(graph):
        visit(module)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_every_folder_has_a_layer():
    tops = {_top(m) for m in _modules()}
    assert tops <= set(LAYER), tops - set(LAYER)


def test_modules_stay_small():
    big = {str(p.relative_to(ROOT)): n for p in ROOT.rglob("*.py")
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > 400}
    assert not big, big
