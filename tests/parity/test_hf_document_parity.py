"""Document masking against HF transformers run on each document separately (torch, CPU fp32).

A packed sample of several documents, with `doc_start` / `position_ids` from `data.samples.document_fields`,
must give every token the logits HF gives it when its document is the whole input (positions from 0, or
from the document's offset in the sample with `reset_position_ids: false`), and the loss over within-document
targets the same gradients as the sum of HF's per-document losses. Every CPU kernel selection is covered:
the fused CPU kernels, the materialising math path, Paddle's ops only, and `attention_math` (the reference);
the loss is the product's fused LM head + loss (the CPU kernel with the first two, the chunked Paddle-op path
with the others), compared per token.
"""
import dataclasses

import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

import torch  # noqa: E402
import transformers  # noqa: E402

from parity_helpers import HEADS, load, production_loss  # noqa: E402

from pretrain_cli.data.samples import document_fields  # noqa: E402
from pretrain_cli.ops import kernels  # noqa: E402
from pretrain_cli.ops.loss import IGNORE_INDEX  # noqa: E402

COMMON = dict(vocab_size=251, hidden_size=32, intermediate_size=56, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)
FAMILIES = {
    "llama": ("LlamaConfig", dict(tie_word_embeddings=False, rope_parameters={
        "rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8})),
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=True, rope_parameters={"rope_type": "default",
                                                                            "rope_theta": 1e6})),
    "qwen3": ("Qwen3Config", dict(tie_word_embeddings=True, head_dim=16,
                                  rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    # multi-head latent attention (dense layers only): value heads narrower than query heads, YaRN
    "deepseek_v3": ("DeepseekV3Config", dict(
        tie_word_embeddings=False, num_key_value_heads=4, q_lora_rank=12, kv_lora_rank=10, qk_nope_head_dim=6,
        qk_rope_head_dim=4, v_head_dim=4, first_k_dense_replace=2, num_nextn_predict_layers=0, rope_parameters={
            "rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 16,
            "mscale": 1.0, "mscale_all_dim": 1.0})),
}
SEQ = 24
# documents per row over the L+1 = 25 tokens of a sample: row 0 has a 1-token document and one that holds
# only the last label; row 1 is cut in two
DOCS = [[7, 1, 12, 4, 1], [3, 22]]


def _kernels(name):
    if name == "cpu":
        return kernels.select(kernels.KernelConfig(attention="flash"), "cpu")
    if name == "math":
        return kernels.select(HEADS["cpu"], "cpu")
    paddle_only = kernels.select(HEADS["chunked"], "cpu")
    if name == "paddle":
        return paddle_only
    return dataclasses.replace(paddle_only, attention_document=kernels.attention_math)  # "reference"


def _hf(family, tmp_path):
    cls, kw = FAMILIES[family]
    torch.manual_seed(0)
    conf = getattr(transformers, cls)(**{**COMMON, **kw})
    model = transformers.AutoModelForCausalLM.from_config(conf, attn_implementation="eager").float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(str(tmp_path), safe_serialization=True)
    return model.eval()


def _pieces(row):
    """(start, end) of each document's inputs in the sample, and where its within-document targets stop."""
    starts = np.cumsum([0] + DOCS[row][:-1])
    ends = np.cumsum(DOCS[row])
    return [(int(a), int(min(e, SEQ)), int(e)) for a, e in zip(starts, ends) if a < SEQ]


@pytest.mark.parametrize("reset", [True, False])
@pytest.mark.parametrize("kernel", ["cpu", "math", "paddle", "reference"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_packed_documents_equal_hf_on_each_document(family, kernel, reset, tmp_path):
    hf = _hf(family, tmp_path)
    ours, _ = load(tmp_path, _kernels(kernel))
    assert ours.kernels.linear_cross_entropy_name == ("cpu" if kernel in ("cpu", "math") else "chunked")
    ids = np.random.default_rng(1).integers(3, COMMON["vocab_size"], (2, SEQ + 1)).astype("int64")
    fields = [document_fields(np.cumsum([0] + d[:-1]), SEQ, reset) for d in DOCS]
    extra = {k: paddle.to_tensor(np.stack([f[k] for f in fields])) for k in fields[0]}
    labels = ids[:, 1:].copy()
    for row in range(2):
        for a, e, end in _pieces(row):
            if end <= SEQ:  # a document's last token predicts the next document's first: no HF counterpart
                labels[row, end - 1] = IGNORE_INDEX
    with paddle.no_grad():
        ours_logits = ours(paddle.to_tensor(ids[:, :-1]), **extra).numpy()  # [2, SEQ, vocab]
    loss, ours_tokens = production_loss(ours, ids[:, :-1], labels, **extra)

    hf_sum, count = 0.0, 0
    for row in range(2):
        for a, e, end in _pieces(row):
            t = torch.from_numpy(ids[row:row + 1, a:e])
            pos = torch.arange(0 if reset else a, (0 if reset else a) + e - a).unsqueeze(0)
            out = hf(input_ids=t, position_ids=pos).logits  # [1, e-a, vocab]
            got = ours_logits[row, a:e]
            assert np.abs(got - out.detach().numpy()[0]).max() <= 1e-4, (row, a)
            n = min(e, end - 1) - a  # within-document targets: tokens a+1 .. min(e, end-1)
            target = torch.from_numpy(ids[row, a + 1:a + 1 + n])
            per_token = torch.nn.functional.cross_entropy(out[0, :n], target, reduction="none")
            np.testing.assert_allclose(ours_tokens[row, a:a + n], per_token.detach().numpy(), atol=2e-5, rtol=0)
            hf_sum, count = hf_sum + per_token.sum(), count + n
    assert count == int((labels != IGNORE_INDEX).sum())
    hf_loss = hf_sum / count
    hf_loss.backward()
    assert abs(loss - float(hf_loss.detach())) <= 1e-5
    hf_params = dict(hf.named_parameters())
    for name, p in ours.named_parameters():
        g = p.grad.numpy()
        g = g.T if g.ndim == 2 and "embed" not in name else g
        np.testing.assert_allclose(g, hf_params[name].grad.numpy(), atol=1e-4, err_msg=name)
