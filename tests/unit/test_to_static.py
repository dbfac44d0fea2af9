"""`to_static: true` (`compiled_forward.compile_forward`, Paddle's SOT) on every kernel path a user can set: the
compiled forward gives the eager loss and gradients, what SOT cannot run is refused or ignored in one line by config,
and a failure inside the compiled forward is one line naming to_static. Micro models, one forward and backward each
(every compiled model is traced anew: a few seconds each)."""
import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

from moe_helpers import moe_cfg  # noqa: E402
from run_helpers import resolve_run  # noqa: E402

from pretrain_cli.errors import UserError  # noqa: E402
from pretrain_cli.models import build_model  # noqa: E402
from pretrain_cli.models.config import ModelConfig  # noqa: E402
from pretrain_cli.ops import compiled_forward, kernels, linear_loss  # noqa: E402
from pretrain_cli.run_config import MoeConfig  # noqa: E402

# what the forwards import lazily, imported before any trace: under pytest a first import inside a compiled forward
# runs pytest's import hook inside SOT's trace, which fails there (UnboundLocalError); `train` has no such hook
from pretrain_cli.ops import fp32, grouped_gemm_layer, linear_loss_layer, tensors  # noqa: E402,F401
from pretrain_cli.models import deepseek_moe, mla, moe, moe_loss  # noqa: E402,F401

CFG = ModelConfig(model_type="qwen2", vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def _loss_and_grads(cfg, chosen, compiled: bool, moe=None, documents=False):
    """One forward and backward of a fresh model (seed 0); the compiled one runs FIRST in each test, as in `train`
    (the old rope cache crashed only when no eager forward had filled it)."""
    from pretrain_cli.data.samples import document_fields

    paddle.seed(0)
    model = build_model(cfg, chosen, moe) if moe is not None else build_model(cfg, chosen)
    if compiled:
        model = compiled_forward.compile_forward(model)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 33)).astype("int64")
    ids, labels = paddle.to_tensor(tokens[:, :-1]), paddle.to_tensor(tokens[:, 1:])  # two tensors, as `train`'s
    extra = {}
    if documents:
        fields = [document_fields(np.array([0, 9, 20, 32]), 32) for _ in range(2)]
        extra = {k: paddle.to_tensor(np.stack([f[k] for f in fields]).astype("int64")) for k in fields[0]}
    total, count = model(ids, labels=labels, **extra)
    loss = total / count
    loss.backward()
    return float(loss), {n: p.grad.numpy() for n, p in model.named_parameters() if p.grad is not None}


def _same_as_eager(cfg, chosen, moe=None, documents=False):
    static, g_static = _loss_and_grads(cfg, chosen, True, moe, documents)
    eager, g_eager = _loss_and_grads(cfg, chosen, False, moe, documents)
    assert static == pytest.approx(eager, abs=1e-6)  # test_moe_router's to_static tolerance
    assert sorted(g_static) == sorted(g_eager)
    for name in g_eager:
        np.testing.assert_allclose(g_static[name], g_eager[name], atol=1e-6, err_msg=name)


def test_paddle_op_path_compiles_to_the_eager_loss():
    """`cpu_fused_ops: false`: the RoPE tables' cache (keyed by the tables' identity) raised SOT's
    `InnerError: [DictVariable] received (...) as key` at the first compiled forward; the fused head + loss on
    Paddle's ops (the GPU path too) then got a `cell` for a bool inside its autograd function."""
    _same_as_eager(CFG, kernels.select(kernels.KernelConfig(cpu_ops=False), "cpu"))


def test_paddle_op_path_with_packed_documents_compiles_to_the_eager_loss():
    """Document masking on Paddle's ops: RoPE rows per position id and per-sample masks, both cached by identity."""
    chosen = kernels.select(kernels.KernelConfig(cpu_ops=False, attention="math"), "cpu")
    _same_as_eager(CFG, chosen, documents=True)


def test_chunked_fused_loss_compiles_to_the_eager_loss_and_gradients():
    rng = np.random.default_rng(0)
    h0, w0 = rng.standard_normal((8, 16)).astype("float32"), rng.standard_normal((32, 16)).astype("float32")
    labels = paddle.to_tensor(np.arange(8, dtype="int64"))

    def run(compiled):
        h, w = paddle.to_tensor(h0, stop_gradient=False), paddle.to_tensor(w0, stop_gradient=False)

        def f(h, w):
            x = (h * 2.0 + 1.0) * 0.5 - 0.5  # enough ops around the call for SOT to keep a graph
            return linear_loss.linear_cross_entropy_chunked(x, w, labels, -100, True) + x.mean()

        out = (paddle.jit.to_static(f, full_graph=False) if compiled else f)(h, w)
        out.backward()
        return float(out), h.grad.numpy(), w.grad.numpy()

    (s, sh, sw), (e, eh, ew) = run(True), run(False)
    assert s == pytest.approx(e, abs=1e-6)
    np.testing.assert_allclose(sh, eh, atol=1e-6)
    np.testing.assert_allclose(sw, ew, atol=1e-6)


def test_deepseek_latent_attention_and_experts_compile_to_the_eager_loss():
    """MLA's de-interleave (SOT built `[*lead, d // 2, 2]` without `d // 2`) and DeepSeek's MoE gate (its
    Routing came back from SOT as a plain tuple: `'tuple' object has no attribute 'indices'`). In a fresh
    interpreter: after test_moe_router's compiled Qwen3-MoE in the same process, this backward crashed in Paddle's
    TopkGradNode (SIGSEGV), which `train`, compiling one model per process, does not meet."""
    code = ("import sys; sys.path.insert(0, %r)\n"
            "import test_to_static as t\n"
            "t._same_as_eager(t.moe_cfg('micro-deepseek-v2'), t.kernels.select(None, 'cpu'), t.MoeConfig(0.5))\n"
            "print('same')" % str(Path(__file__).parent))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("same"), done.stderr[-3000:]


def test_a_failure_inside_the_compiled_forward_is_one_line_naming_to_static():
    class Broken(paddle.nn.Layer):  # what SOT did to the fused loss on Paddle's ops: an op handed a closure's cell
        def __init__(self):
            super().__init__()
            self.linear = paddle.nn.Linear(4, 4)

        def forward(self, x):
            y = self.linear(x) * 2.0 + 1.0
            if y.shape[0] == 3:
                raise TypeError("(InvalidType) matmul(): argument (position 4) must be bool, but got cell")
            return y.mean()

    model = compiled_forward.compile_forward(Broken())
    with pytest.raises(UserError) as got:
        model(paddle.ones([3, 4]))
    line = str(got.value)
    assert "\n" not in line and line.startswith("to_static: ") and "set to_static false" in line
    assert got.value.__cause__ is not None  # the traceback --debug prints

    class OutOfMemory(paddle.nn.Layer):
        def forward(self, x):
            raise MemoryError("(ResourceExhausted) out of memory")

    with pytest.raises(MemoryError):  # not to_static's failure: the run's out-of-memory handling reads it
        compiled_forward.compile_forward(OutOfMemory())(paddle.ones([2]))


def test_config_refuses_or_ignores_what_sot_cannot_run_in_one_line():
    with pytest.raises(UserError, match="to_static: not supported with recompute_granularity full"):
        resolve_run("--to_static", "true", "--recompute", "true")
    for ok in (("--recompute_use_reentrant", "true"), ("--recompute_granularity", "core_attn")):
        assert resolve_run("--to_static", "true", "--recompute", "true", *ok).kernels.to_static
    assert resolve_run("--to_static", "false", "--recompute", "true").recompute is not None
    tp = resolve_run("--to_static", "true", "--tensor_parallel_degree", "2", world=2)
    assert not tp.kernels.to_static
    assert [n for n in tp.notes if n.startswith("to_static:")] == [
        "to_static: not with the semi-auto engine (tensor parallelism, ZeRO-2/3: SOT fails on its distributed tensors "
        "at the first forward); ignored"]
    ep = resolve_run("--to_static", "true", "--expert_parallel_degree", "2", world=2, model="micro-qwen2-moe")
    assert not ep.kernels.to_static and [n for n in ep.notes if n.startswith("to_static:")] == [
        "to_static: not with expert parallelism (SOT fails in its all-gather of the tokens at the first forward); "
        "ignored"]
    assert resolve_run("--to_static", "true", "--per_device_train_batch_size", "1", world=2).kernels.to_static  # dp
    assert resolve_run("--to_static", "true", "--context_parallel_degree", "2", world=2).kernels.to_static


def test_fused_cpu_kernels_still_compile(monkeypatch):
    """The default CPU path (our fused kernels) keeps compiling to the eager loss."""
    _same_as_eager(CFG, dataclasses.replace(kernels.select(None, "cpu")))
