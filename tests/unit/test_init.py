"""The per-tensor initialiser (`models.init`) and the lazy build it serves (`distributed.layout.materialize`): any block of a
tensor is exactly the same block of the whole tensor, whatever chunks its rows cross; the distributions are the
eager model's (PaddleNLP's init); a lazily built model has no storage until its parameters are created."""
from __future__ import annotations

import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

from pretrain_cli.config.presets import PRESET_DIR  # noqa: E402
from pretrain_cli.distributed.layout.materialize import InitSource, fill, pending, read_block, whole_box  # noqa: E402
from pretrain_cli.distributed.layout.pieces import Box  # noqa: E402
from pretrain_cli.models import build_model, init  # noqa: E402
from pretrain_cli.models.config import ModelConfig  # noqa: E402

CFG = ModelConfig.from_file(str(PRESET_DIR / "tiny-qwen2"))


@pytest.mark.parametrize("rows", [1, 3, 7, 1000])  # chunks of 1, 3, 7 rows and one chunk for the whole tensor
def test_every_block_is_the_same_block_of_the_whole_tensor(monkeypatch, rows):
    shape = (11, 6)
    monkeypatch.setattr(init, "CHUNK", rows * shape[1])
    whole = init.block(CFG, 5, "model.layers.0.mlp.up_proj.weight", shape)
    assert whole.dtype == np.float32 and whole.shape == shape
    for offsets, size in [((0, 0), (6, 6)), ((6, 0), (5, 6)), ((0, 0), (11, 3)), ((0, 3), (11, 3)),
                          ((2, 1), (7, 4)), ((10, 5), (1, 1)), ((4, 0), (0, 6))]:
        got = init.block(CFG, 5, "model.layers.0.mlp.up_proj.weight", shape, offsets, size)
        np.testing.assert_array_equal(got, whole[offsets[0]:offsets[0] + size[0], offsets[1]:offsets[1] + size[1]])


def test_values_depend_on_seed_and_name_not_on_what_was_built_before():
    a = init.block(CFG, 5, "model.layers.0.mlp.up_proj.weight", (8, 8))
    assert np.array_equal(a, init.block(CFG, 5, "model.layers.0.mlp.up_proj.weight", (8, 8)))
    assert not np.array_equal(a, init.block(CFG, 6, "model.layers.0.mlp.up_proj.weight", (8, 8)))
    assert not np.array_equal(a, init.block(CFG, 5, "model.layers.1.mlp.up_proj.weight", (8, 8)))


def test_rules_are_the_eager_models_distributions():
    paddle.seed(0)
    eager = dict(build_model(CFG).named_parameters())
    residual = CFG.initializer_range / np.sqrt(2 * CFG.num_hidden_layers)
    seen = set()
    for name, p in eager.items():
        kind, value = init.rule(CFG, name)
        values = p.numpy()
        if kind == "constant":
            assert np.all(values == value), name
        else:
            assert abs(values.std() / value - 1) < 0.1, (name, values.std(), value)
            drawn = init.block(CFG, 0, name, tuple(p.shape))
            assert abs(drawn.std() / value - 1) < 0.1 and abs(drawn.mean()) < value / 10, name
        seen.add((kind, round(value, 6)))
    assert ("normal", round(residual, 6)) in seen and ("constant", 1.0) in seen and ("constant", 0.0) in seen


def test_a_lazily_built_model_gets_storage_only_where_created():
    with paddle.LazyGuard():
        model = build_model(CFG)
    params = dict(model.named_parameters())
    assert all(pending(p) for p in params.values())
    source = InitSource(CFG, 3)
    done = fill(model, source, keep=lambda name: name.startswith("model.layers.0."))
    assert done == sum(n.startswith("model.layers.0.") for n in params)
    assert all(pending(p) != n.startswith("model.layers.0.") for n, p in params.items())
    w = params["model.layers.0.self_attn.q_proj.weight"]
    np.testing.assert_array_equal(w.numpy(), source("model.layers.0.self_attn.q_proj.weight", whole_box(w)))
    half = Box(tuple(w.shape), (0, w.shape[1] // 2), (w.shape[0], w.shape[1] // 2))  # a TP column slice
    np.testing.assert_array_equal(source("model.layers.0.self_attn.q_proj.weight", half), w.numpy()[:, w.shape[1] // 2:])


def test_drawing_chunks_in_threads_gives_the_same_values(monkeypatch):
    monkeypatch.setattr(init, "CHUNK", 3 * 6)
    one = init.block(CFG, 5, "model.layers.0.mlp.up_proj.weight", (11, 6), (1, 2), (9, 3))
    np.testing.assert_array_equal(one, init.block(CFG, 5, "model.layers.0.mlp.up_proj.weight", (11, 6), (1, 2), (9, 3),
                                                  workers=3))


def test_a_block_is_read_in_the_dtype_the_run_holds_the_parameter_in():
    """`read_block` (what the placed and the tensor-parallel layouts create a parameter from): the parameter's
    own dtype, or the source's when set (AMP's O2 cast, which a parameter without storage does not take on)."""
    name = "model.layers.0.self_attn.q_proj.weight"
    with paddle.LazyGuard():
        w = dict(build_model(CFG).named_parameters())[name]
    source = InitSource(CFG, 3)
    half = Box(tuple(w.shape), (0, w.shape[1] // 2), (w.shape[0], w.shape[1] // 2))
    got = read_block(name, w, source, half)
    assert got.dtype == paddle.float32 and tuple(got.shape) == half.shape
    np.testing.assert_array_equal(got.numpy(), source(name, half))
    source.dtype = paddle.bfloat16
    cast = read_block(name, w, source, half)
    assert cast.dtype == paddle.bfloat16 and pending(w)
    np.testing.assert_array_equal(cast.astype("float32").numpy(), got.astype("bfloat16").astype("float32").numpy())
