"""Every Paddle API the package calls exists in the installed Paddle and accepts the arguments we pass.

Why: the GPU path (flash attention, flashmask, fused RMSNorm/RoPE, swiglu, AMP O2, sharding and tensor
parallelism) never runs Paddle's real GPU kernels in CI, which has no GPU (tests/parity/test_gpu_branch.py runs the
kernel branch behind reference ops, so layouts, tuples and masks are checked there); a rename or a dropped keyword
in a Paddle release would otherwise surface only on someone's GPU machine. The CPU wheel ships the same Python API, so the calls
are checked here against `inspect.signature`.

The list of calls is not written by hand: an AST scan of every module under `src/pretrain_cli` resolves
each attribute chain or name rooted at a Paddle import (`import paddle.nn.functional as F`,
`from paddle.incubate.nn.functional import swiglu`, ...) to its dotted path, per function scope, so a
new call anywhere (a new fused loss, a new distributed API) is covered without editing this file.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "pretrain_cli"

# The GPU path's entry points: the scan must find each of them (a scan that silently finds nothing passes
# nothing). Keyword arguments listed must be among those the source passes.
GPU_PATH = {
    "paddle.incubate.nn.functional.fused_rms_norm": (),
    "paddle.incubate.nn.functional.fused_rotary_position_embedding": ("sin", "cos", "position_ids",
                                                                      "use_neox_rotary_style"),
    "paddle.incubate.nn.functional.swiglu": (),
    "paddle.nn.functional.flashmask_attention": ("causal",),
    "paddle.nn.functional.scaled_dot_product_attention": ("is_causal",),
    "paddle.nn.functional.swiglu": (),
    "paddle.amp.auto_cast": ("custom_black_list", "custom_white_list"),
    "paddle.amp.decorate": ("models", "optimizers", "level"),
    "paddle.amp.GradScaler": ("init_loss_scaling",),
    "paddle.distributed.shard_layer": (),
    "paddle.distributed.shard_optimizer": (),
    "paddle.distributed.shard_tensor": (),
    "paddle.distributed.shard_scaler": (),
    "paddle.distributed.reshard": (),
    "paddle.distributed.ShardingStage1": (),
    "paddle.distributed.ShardingStage2": (),
    "paddle.distributed.ShardingStage3": (),
    "paddle.distributed.ProcessMesh": ("dim_names",),
    "paddle.distributed.fleet.init": ("is_collective", "strategy"),
    "paddle.distributed.fleet.DistributedStrategy": (),
    "paddle.distributed.fleet.distributed_model": (),
    "paddle.distributed.fleet.distributed_optimizer": (),
    "paddle.distributed.fleet.distributed_scaler": (),
    "paddle.DataParallel": ("find_unused_parameters",),
    "paddle.device.cuda.max_memory_allocated": (),
    "paddle.device.cuda.get_device_capability": (),  # bf16 and flash attention by compute capability (issue #60)
    "paddle.incubate.nn.functional.batched_gemm": (),  # the MoE experts (ops/grouped.grouped_mlp_gpu)
    "paddle._C_ops.flash_attn": (),  # context parallelism's blocks (ops/gpu_attention.block_forward_flash)
}


@dataclass(frozen=True)
class Use:
    path: str  # dotted Paddle path, e.g. paddle.amp.decorate
    where: str  # file:line
    keywords: tuple = ()
    positional: int = 0
    call: bool = False
    star: bool = False  # *args/**kwargs at the call: counts unknown


def _bindings(nodes) -> dict[str, str]:
    """Names bound to Paddle modules/objects by the import statements among `nodes`."""
    out = {}
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "paddle":
                    out[alias.asname or "paddle"] = alias.name if alias.asname else "paddle"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "paddle":
            for alias in node.names:
                out[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return out


def _chain(node) -> list[str] | None:
    """`a.b.c` → ["a", "b", "c"]; None if the chain is not names and attributes only."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


_SCOPE = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def _walk_scope(node):
    """The nodes of one scope: like `ast.walk`, but nested functions/classes are left to their own visit."""
    todo = list(ast.iter_child_nodes(node))
    while todo:
        n = todo.pop()
        yield n
        if not isinstance(n, _SCOPE):
            todo.extend(ast.iter_child_nodes(n))


def _scopes(tree):
    """(scope, the Paddle names it sees): the module, then each function or class with its enclosing imports."""
    def visit(node, inherited):
        names = {**inherited, **_bindings(_walk_scope(node))}
        yield node, names
        for n in _walk_scope(node):
            if isinstance(n, _SCOPE):
                yield from visit(n, names)

    yield from visit(tree, {})


def scan_source(source: str, filename: str) -> list[Use]:
    """Every use of a Paddle name in `source`: the longest resolvable chain, and at calls the arguments."""
    tree = ast.parse(source, filename)
    uses: dict[tuple, Use] = {}
    for scope, names in _scopes(tree):
        if not names:
            continue
        nodes = list(_walk_scope(scope))
        inner = {id(n.func) for n in nodes if isinstance(n, ast.Call)}
        inner |= {id(n.value) for n in nodes if isinstance(n, ast.Attribute)}
        for node in nodes:
            target = node.func if isinstance(node, ast.Call) else node
            if not isinstance(target, (ast.Attribute, ast.Name)) or (node is target and id(node) in inner):
                continue  # a chain that is part of a longer chain or of a call is reported there
            if isinstance(getattr(target, "ctx", None), ast.Store):
                continue
            parts = _chain(target)
            if not parts or parts[0] not in names or (isinstance(node, ast.Name)):
                continue
            path = ".".join([names[parts[0]], *parts[1:]])
            where = f"{filename}:{node.lineno}"
            if isinstance(node, ast.Call):
                star = any(isinstance(x, ast.Starred) for x in node.args) or any(k.arg is None for k in node.keywords)
                uses[(path, where, True)] = Use(path, where, tuple(k.arg for k in node.keywords if k.arg),
                                                len(node.args), True, star)
            else:
                uses.setdefault((path, where, False), Use(path, where))
    return sorted(uses.values(), key=lambda u: (u.path, u.where))


def _resolve(path: str):
    """The object `path` names, as Python's import would find it: an attribute before a submodule of the same
    name (`paddle.amp.auto_cast` is a function and a module); where that chain breaks, the longest module the path
    begins with, as `from paddle.distributed.launch.controllers import master` finds it (`paddle.distributed.launch`
    is also a function); raises if any piece is missing."""
    try:
        return _by_attributes(path)
    except AttributeError as first:
        parts = path.split(".")
        for k in range(len(parts) - 1, 1, -1):
            try:
                obj = importlib.import_module(".".join(parts[:k]))
            except ImportError:
                continue
            for attr in parts[k:]:
                if not hasattr(obj, attr):
                    raise first from None
                obj = getattr(obj, attr)
            return obj
        raise


def _by_attributes(path: str):
    parts = path.split(".")
    obj = importlib.import_module(parts[0])
    for i, attr in enumerate(parts[1:], start=1):
        if hasattr(obj, attr):
            obj = getattr(obj, attr)
        elif inspect.ismodule(obj):
            obj = importlib.import_module(".".join(parts[: i + 1]))
        else:
            raise AttributeError(f"{'.'.join(parts[:i])} has no attribute {attr!r}")
    return obj


@dataclass(frozen=True)
class Params:
    names: frozenset  # accepted by keyword
    positional: int  # how many may be passed by position
    var_positional: bool
    var_keyword: bool


def _split_top(text: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch in "([{<") - (ch in ")]}>")
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return [x for x in [*out, cur.strip()] if x]


def _from_docstring(obj) -> list[Params]:
    """pybind11 objects (Paddle's C++ classes and functions) have no `__signature__` but write each overload
    as `name(self: T, dim: int, *, split_factor: int = 1) -> None` in their docstring."""
    doc = (obj.__init__ if inspect.isclass(obj) else obj).__doc__ or ""
    overloads = []
    for line in doc.splitlines():
        line = re.sub(r"^\d+\. ", "", line.strip())
        m = re.match(r"^\w+\((.*)\) ->", line)
        if not m:
            continue
        names, positional, kw_only, var_pos, var_kw = [], 0, False, False, False
        for tok in _split_top(m.group(1)):
            name = tok.split(":")[0].split("=")[0].strip()
            if name == "self":
                continue
            if name == "*":
                kw_only = True
            elif name.startswith("**"):
                var_kw = True
            elif name.startswith("*"):
                var_pos = kw_only = True
            else:
                names.append(name)
                positional += not kw_only
        overloads.append(Params(frozenset(names), positional, var_pos, var_kw))
    return overloads


def _signatures(obj) -> list[Params]:
    try:
        params = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):
        return _from_docstring(obj)
    kinds = inspect.Parameter
    return [Params(frozenset(p.name for p in params if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)),
                   sum(p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD) for p in params),
                   any(p.kind is kinds.VAR_POSITIONAL for p in params),
                   any(p.kind is kinds.VAR_KEYWORD for p in params))]


def _mismatch(use: Use, sig: Params) -> list[str]:
    out = [] if sig.var_keyword else [f"has no parameter {k!r}" for k in use.keywords if k not in sig.names]
    if not use.star and not sig.var_positional and use.positional > sig.positional:
        out.append(f"takes {sig.positional} positional arguments, we pass {use.positional}")
    return out


def check(uses: list[Use]) -> list[str]:
    """One line per problem: a missing name, an unknown keyword, too many positional arguments."""
    problems = []
    for use in uses:
        try:
            obj = _resolve(use.path)
        except (ImportError, AttributeError) as exc:
            problems.append(f"{use.where}: {use.path} does not exist in this Paddle ({exc})")
            continue
        if not use.call:
            continue
        overloads = _signatures(obj)
        if not overloads and use.path.startswith("paddle._C_ops.") and not use.keywords:
            continue  # generated C++ operators publish no signature; tensors go by position, checked by name only
        if not overloads:
            problems.append(f"{use.where}: {use.path} has no signature to check against")
            continue
        mismatches = [_mismatch(use, sig) for sig in overloads]
        if all(mismatches):  # no overload accepts the call: report the first one's reasons
            problems += [f"{use.where}: {use.path} {why}" for why in mismatches[0]]
    return problems


@pytest.fixture(scope="module")
def package_uses() -> list[Use]:
    uses = []
    for path in sorted(PACKAGE.rglob("*.py")):
        uses += scan_source(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE)))
    return uses


def test_every_paddle_call_in_the_package_exists_with_our_arguments(package_uses):
    import paddle  # noqa: F401 (the scan resolves against the installed Paddle)

    assert len({u.path for u in package_uses}) > 60, "the scan found too few Paddle names: is it still resolving?"
    assert check(package_uses) == []


def test_the_scan_covers_the_gpu_path(package_uses):
    """The GPU-only entry points are found by the scan, with the keywords the GPU code passes."""
    found: dict[str, set] = {}
    for u in package_uses:
        found.setdefault(u.path, set()).update(u.keywords)
    missing = {name: sorted(set(kws) - found.get(name, set())) for name, kws in GPU_PATH.items()
               if name not in found or set(kws) - found[name]}
    assert missing == {}, "GPU-path calls no longer found by the scan (moved or renamed in our source?)"


def test_a_renamed_api_or_a_dropped_keyword_fails():
    """The checker itself: each kind of drift is reported, with the file and line."""
    source = (
        "import paddle\n"
        "import paddle.nn.functional as F\n"
        "from paddle.incubate.nn.functional import fused_rotary_position_embedding as rope\n"
        "def f(q, k, v, model, opt):\n"
        "    import paddle.distributed as dist\n"
        "    F.flash_attention_v9(q, k, v)\n"  # renamed away
        "    F.scaled_dot_product_attention(q, k, v, is_casual=True)\n"  # keyword that does not exist
        "    rope(q, k, None, sin=q, cos=q, use_neox_rotary_style=False)\n"  # fine
        "    paddle.amp.decorate(models=model, optimizers=opt, level='O2', master_grad_v2=True)\n"
        "    dist.ShardingStage4('dp')\n"
        "    paddle.nn.functional.silu(q, None, 1, 2, 3)\n"  # too many positional arguments
    )
    problems = check(scan_source(source, "probe.py"))
    assert any("probe.py:6" in p and "flash_attention_v9" in p for p in problems)
    assert any("probe.py:7" in p and "'is_casual'" in p for p in problems)
    assert any("probe.py:9" in p and "'master_grad_v2'" in p for p in problems)
    assert any("probe.py:10" in p and "ShardingStage4" in p for p in problems)
    assert any("probe.py:11" in p and "positional" in p for p in problems)
    assert not any("probe.py:8" in p for p in problems)
    assert len(problems) == 5
