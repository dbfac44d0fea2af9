"""The references of gpu_references.py refuse what Paddle's GPU kernels refuse (fused_rope_kernel.cu's shape and
type checks, rms_norm_kernel.cu's one type): a caller the GPU would stop must stop here too. Before, the RoPE
reference cut a longer table to the sequence and the RMSNorm reference cast an fp32 weight to compute."""
import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

from gpu_references import _t, ref_fused_rms_norm, ref_fused_rope  # noqa: E402

rng = np.random.default_rng(0)


def _tables(rows: int, head_dim: int = 8, dtype: str = "float32"):
    ang = np.outer(np.arange(rows), 1.0 / 10000 ** (np.arange(0, head_dim, 2) / head_dim))
    ang = np.concatenate([ang, ang], -1)  # [rows, head_dim]
    return (_t(np.sin(ang), dtype).reshape([1, rows, 1, head_dim]),
            _t(np.cos(ang), dtype).reshape([1, rows, 1, head_dim]))  # [1, rows, 1, head_dim] each


def _qk(seq: int = 6, dtype: str = "float32"):
    return _t(rng.standard_normal((2, seq, 4, 8)), dtype), _t(rng.standard_normal((2, seq, 2, 8)), dtype)


def test_the_rope_reference_wants_a_table_as_long_as_the_sequence_without_position_ids():
    q, k = _qk(6)
    sin, cos = _tables(6)
    ref_fused_rope(q, k, None, sin=sin, cos=cos, use_neox_rotary_style=False)  # exactly seq long: accepted
    sin, cos = _tables(8)
    with pytest.raises(ValueError, match="exactly"):
        ref_fused_rope(q, k, None, sin=sin, cos=cos, use_neox_rotary_style=False)


def test_with_position_ids_a_longer_table_serves_and_a_shorter_one_is_refused():
    q, k = _qk(6)
    pos = paddle.to_tensor(np.tile(np.arange(6, dtype=np.int64), (2, 1)))  # [2, 6]
    exact = ref_fused_rope(q, k, None, *_tables(6), position_ids=pos, use_neox_rotary_style=False)
    longer = ref_fused_rope(q, k, None, *_tables(9), position_ids=pos, use_neox_rotary_style=False)
    for a, b in zip(exact[:2], longer[:2]):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    with pytest.raises(ValueError, match="at least"):
        ref_fused_rope(q, k, None, *_tables(5), position_ids=pos, use_neox_rotary_style=False)


def test_the_rope_reference_reads_tables_and_k_as_qs_type():
    q, k = _qk(6, "bfloat16")
    with pytest.raises(ValueError, match="sin is paddle.float32"):
        ref_fused_rope(q, k, None, *_tables(6, dtype="float32"), use_neox_rotary_style=False)
    with pytest.raises(ValueError, match="k is paddle.float32"):
        ref_fused_rope(q, k.astype("float32"), None, *_tables(6, dtype="bfloat16"), use_neox_rotary_style=False)
    sin, cos = _tables(6)
    with pytest.raises(ValueError, match="the same"):
        ref_fused_rope(_qk(6)[0], None, None, sin=sin, cos=cos.reshape([6, 8]), use_neox_rotary_style=False)


@pytest.mark.parametrize("name", ["norm_weight", "residual"])
def test_the_rms_norm_reference_refuses_a_weight_or_residual_of_another_type(name):
    x, w = rng.standard_normal((2, 5, 16)), rng.standard_normal(16)
    args = dict(norm_weight=_t(w, "bfloat16"), residual=_t(x, "bfloat16"))
    ref_fused_rms_norm(_t(x, "bfloat16"), args["norm_weight"], None, 1e-6, 2, residual=args["residual"])
    args[name] = args[name].astype("float32")  # an fp32 weight (or residual) beside a bf16 x
    with pytest.raises(ValueError, match=f"{name} is paddle.float32"):
        ref_fused_rms_norm(_t(x, "bfloat16"), args["norm_weight"], None, 1e-6, 2, residual=args["residual"])
