"""FP8 block-quantized checkpoints (DeepSeek's release format) are dequantized on load, by both readers.

The test makes a micro FP8 checkpoint from a bf16 original (torch's float8_e4m3fn, DeepSeek's per-block
`weight_scale_inv`, blocks smaller than the micro weights so several blocks and ragged edges are crossed),
then loads it whole (`weight_source.load_weights`: eval, generate, a rollback) and block by block (`WeightSource`: `train`'s
`continue_training`, one rank's slice): both give exactly torch's dequantization, and the bf16 original within
FP8's rounding (3 mantissa bits: half a step is 1/16 of the value).
"""
import json

import numpy as np

from pretrain_cli import runtime

paddle = runtime.import_paddle()

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from pretrain_cli.distributed.layout.pieces import Box  # noqa: E402
from pretrain_cli.models import build_model, convert  # noqa: E402
from pretrain_cli.models.config import ModelConfig  # noqa: E402
from pretrain_cli.storage import fp8  # noqa: E402
from pretrain_cli.training.weight_source import WeightSource, load_weights  # noqa: E402

MICRO = ModelConfig(model_type="deepseek_v3", vocab_size=97, hidden_size=40, intermediate_size=72,
                    num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=64, q_lora_rank=24,
                    kv_lora_rank=20, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
                    first_k_dense_replace=1)
BLOCK = (16, 16)


def test_decode_table_equals_torch_float8_e4m3fn():
    bits = torch.arange(256, dtype=torch.uint8)
    want = bits.view(torch.float8_e4m3fn).float().numpy()
    np.testing.assert_array_equal(fp8.decode(np.arange(256)), want)  # NaN codes included (assert_array_equal: NaN == NaN)


def _fp8_checkpoint(tmp_path):
    """(dir, {HF name: bf16 original fp32 [out, in]}, {HF name: torch's dequantized fp32}) of the micro model."""
    paddle.seed(0)
    model = build_model(MICRO)
    originals, torch_deq, tensors = {}, {}, {}
    for name, p, transpose in convert.hf_params(model):
        w = torch.from_numpy(p.numpy().T.copy() if transpose else p.numpy()).to(torch.bfloat16)
        if transpose and "embed" not in name and "lm_head" not in name:  # DeepSeek quantizes the layers' Linears
            original = w.float().numpy()
            bits, scale = fp8.quantize(original, BLOCK)
            q = torch.from_numpy(bits).view(torch.float8_e4m3fn)
            rows = torch.arange(q.shape[0]) // BLOCK[0]
            cols = torch.arange(q.shape[1]) // BLOCK[1]
            torch_deq[name] = (q.float() * torch.from_numpy(scale)[rows][:, cols]).numpy()
            originals[name] = original
            tensors[name], tensors[name + "_scale_inv"] = q, torch.from_numpy(scale)
        else:
            tensors[name] = w
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    conf = MICRO.to_hf_dict(dtype="bfloat16")
    conf["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                   "weight_block_size": list(BLOCK)}
    (tmp_path / "config.json").write_text(json.dumps(conf))
    return tmp_path, originals, torch_deq


def test_fp8_checkpoint_loads_to_its_bf16_original(tmp_path):
    src, originals, torch_deq = _fp8_checkpoint(tmp_path)
    assert len(originals) == 8  # q_a, q_b, kv_a_with_mqa, kv_b, o_proj and the dense MLP's gate, up, down
    cfg = ModelConfig.from_file(str(src))
    assert "quantization_config" not in cfg.to_hf_dict()  # what we export is never FP8
    model = build_model(cfg)
    load_weights(model, src, use="continue_training")
    params = {n: (p, t) for n, p, t in convert.hf_params(model)}
    for name, original in originals.items():
        p, transpose = params[name]
        got = p.numpy().T if transpose else p.numpy()
        np.testing.assert_array_equal(got, torch_deq[name], err_msg=name)
        assert np.all(np.abs(got - original) <= np.abs(original) / 16 + 1e-6), name
        assert np.abs(got - original).max() > 0, name  # it was quantized: not a copy of the original


def test_fp8_blocks_read_by_train_equal_whole_dequantization(tmp_path):
    src, originals, torch_deq = _fp8_checkpoint(tmp_path)
    lazy = build_model(ModelConfig.from_file(str(src)))
    source = WeightSource(src, lazy, "pretrained model", use="continue_training")
    try:
        name = "model.layers.0.mlp.down_proj.weight"  # Paddle [72, 40]: HF [40, 72], crossing 3 x 5 blocks
        whole = source(name, Box((72, 40), (0, 0), (72, 40)))
        np.testing.assert_array_equal(whole, torch_deq[name].T)
        part = source(name, Box((72, 40), (20, 10), (30, 25)))  # a TP/ZeRO-3 style block off the block grid
        np.testing.assert_array_equal(part, torch_deq[name].T[20:50, 10:35])
    finally:
        source.close()
