"""The package's folders are its layers: lower layers never import higher ones, and nothing imports in a circle.

Every `import` counts, including those inside functions (a lazy import is still a dependency) and those made
through `importlib` (every module name written as a string in a module that imports that way). A subcommand
never imports another one, and the model code reads no environment variables and no ranks.
"""
import ast
from pathlib import Path

import pretrain_cli

ROOT = Path(pretrain_cli.__file__).parent
# __main__ -> cli -> commands -> orchestration -> config -> training -> {planning, distributed} -> {models, data}
# -> {ops, storage} -> the base modules
LAYER = {"__main__": 10, "cli": 9, "commands": 8, "orchestration": 7, "config": 6, "training": 5, "planning": 4,
         "distributed": 4, "models": 3, "data": 3, "ops": 2, "storage": 2, "errors": 1, "runtime": 1, "start_signals": 1, "atomic": 1,
         "run_dir": 1, "json_mistakes": 1, "run_config": 1, "counts": 1, "run_layout": 1, "processes": 1, "waiting": 1, "__init__": 1}
# inside distributed/ its sub-packages are layers too: the launcher side (no Paddle at import) -> the one collectives
# backend -> the layout arithmetic (ranks, pieces) -> the layout steps -> the strategies (the data side) -> setup
DISTRIBUTED = {"launcher": 1, "comms": 2, "layout": 3, "steps": 4, "strategies": 5, "setup": 6, "__init__": 6}


def _is_module(name: str) -> bool:
    parts = name.split(".")
    return parts[0] == "pretrain_cli" and (ROOT.joinpath(*parts[1:]).with_suffix(".py").is_file()
                                           or ROOT.joinpath(*parts[1:]).is_dir())


def _dynamic_imports(tree) -> set[str]:
    """Modules imported by name at run time: with `importlib.import_module` or `__import__` in a module, every
    string in it that names a pretrain_cli module (cli.py's subcommand table) counts as an import."""
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and (
        (isinstance(n.func, ast.Attribute) and n.func.attr == "import_module")
        or (isinstance(n.func, ast.Name) and n.func.id in ("import_module", "__import__")))]
    if not calls:
        return set()
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and _is_module(n.value)}


def _modules() -> dict[str, set[str]]:
    """module name -> the pretrain_cli modules it imports."""
    graph = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        name = ".".join(("pretrain_cli", *rel.parts)).removesuffix(".__init__")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        deps = _dynamic_imports(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pretrain_cli"):
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    deps.add(sub if _is_module(sub) else node.module)
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("pretrain_cli")}
        graph[name] = {d for d in deps if d != name}
    return graph


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _sub(module: str) -> str:
    """The sub-package (or front-door module) of a module inside distributed/."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 else "__init__"


def test_lower_layers_never_import_higher_ones():
    bad = []
    for module, deps in _modules().items():
        for dep in deps:
            a, b = _top(module), _top(dep)
            if a != b and (LAYER[b] > LAYER[a] or (LAYER[b] == LAYER[a] and LAYER[a] > 1)):
                bad.append(f"{module} ({a}, layer {LAYER[a]}) imports {dep} ({b}, layer {LAYER[b]})")
    assert not bad, "\n".join(sorted(bad))


def test_distributed_sub_packages_are_layers():
    """A sub-package of distributed/ imports only the ones below it (`DISTRIBUTED`), never one beside or above."""
    bad = []
    for module, deps in _modules().items():
        for dep in deps:
            if _top(module) == _top(dep) == "distributed" and (a := _sub(module)) != (b := _sub(dep)) \
                    and DISTRIBUTED[b] >= DISTRIBUTED[a]:
                bad.append(f"{module} ({a}, layer {DISTRIBUTED[a]}) imports {dep} ({b}, layer {DISTRIBUTED[b]})")
    assert not bad, "\n".join(sorted(bad))


def test_the_launcher_side_imports_no_paddle_at_import():
    """`train` reads the world size (`launcher.launch`) before Paddle starts, and a rank's watcher is a fork that
    must not hold Paddle's state: the launcher side imports Paddle inside functions only."""
    bad = []
    for path in (ROOT / "distributed" / "launcher").rglob("*.py"):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad += [f"{path.name}:{node.lineno} imports {n}" for n in names if n.split(".")[0] == "paddle"]
    assert not bad, bad


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
    subs = {_sub(m) for m in _modules() if _top(m) == "distributed"}
    assert subs <= set(DISTRIBUTED), subs - set(DISTRIBUTED)


def test_modules_stay_small():
    big = {str(p.relative_to(ROOT)): n for p in ROOT.rglob("*.py")
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > 400}
    assert not big, big


def test_no_subcommand_imports_another():
    """What two commands share lives a layer down (e.g. `train`'s out-of-memory hint is `orchestration.planned`)."""
    graph = _modules()
    found = {(module, dep) for module, deps in graph.items() for dep in deps
             if module.startswith("pretrain_cli.commands.") and dep.startswith("pretrain_cli.commands.")}
    assert not found, sorted(found)
    assert {f"pretrain_cli.commands.{name}" for name in ("train", "plan", "eval", "generate")} <= graph["pretrain_cli.cli"]


# what model code may not touch: the environment, and which process it is (parallelism wraps the finished model)
_ENV = {"environ", "getenv", "putenv", "unsetenv", "environb"}
_RANKS = {"rank", "local_rank", "world_size", "nranks", "get_rank", "get_world_size", "ParallelEnv", "is_rank0",
          "data_rank", "tp_degree", "dp_degree", "parallel"}


def _model_code_violations(source: str) -> list[str]:
    bad = []
    for node in ast.walk(ast.parse(source)):
        word = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else (
            node.arg if isinstance(node, ast.keyword) else None)
        if word in _ENV:
            bad.append(f"line {node.lineno}: reads the environment ({word})")
        elif word in _RANKS:
            bad.append(f"line {node.lineno}: asks which process it is ({word})")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(
                ("PADDLE_TRAINER", "PADDLE_RANK", "PADDLE_LOCAL", "PADDLE_GLOBAL", "PRETRAIN_CLI_")):
            bad.append(f"line {node.lineno}: names an environment variable ({node.value})")
    return sorted(bad)


def test_model_code_reads_no_environment_and_no_ranks():
    assert _model_code_violations("import os\nx = os.environ.get('PADDLE_TRAINER_ID')\nr = dist.get_rank()\n") == [
        "line 2: names an environment variable (PADDLE_TRAINER_ID)", "line 2: reads the environment (environ)",
        "line 3: asks which process it is (get_rank)"]
    bad = {str(p.relative_to(ROOT)): v for p in (ROOT / "models").rglob("*.py")
           if (v := _model_code_violations(p.read_text(encoding="utf-8")))}
    assert not bad, bad


def test_classes_are_defined_at_module_level():
    """A class made inside a function is a new class per call (two sets of autograd functions, isinstance checks
    that fail across calls) and cannot be found or imported: every class is at a module's top level (or a class's)."""
    bad = []
    for path in ROOT.rglob("*.py"):
        for func in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                bad += [f"{path.relative_to(ROOT)}:{node.lineno} {node.name} in {func.name}"
                        for node in ast.walk(func) if isinstance(node, ast.ClassDef)]
    assert not bad, bad
