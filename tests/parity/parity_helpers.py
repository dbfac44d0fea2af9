"""The parity tests' shared parts. Our model as the product runs it: built with a kernel selection, the loss from the
fused LM head + loss (what `train` and `eval` run), and each counted token's loss from that same head + loss.
transformers' side: a perturbed micro model, its loss and gradients (per expert for the fused MoE experts), and
the round trip of an export read back by transformers."""
import numpy as np

from pretrain_cli import runtime

paddle = runtime.import_paddle()

from pretrain_cli.models import build_model, convert  # noqa: E402
from pretrain_cli.models.config import ModelConfig  # noqa: E402
from pretrain_cli.ops import kernels  # noqa: E402
from pretrain_cli.ops.loss import IGNORE_INDEX, mean_loss  # noqa: E402
from pretrain_cli.training.weight_source import load_weights  # noqa: E402

# the two fused head + loss paths: the CPU kernel (with the fused CPU kernels) and the chunked Paddle-op path
# (cpu_fused_ops: false on CPU; the GPU's path)
HEADS = {"cpu": kernels.KernelConfig(), "chunked": kernels.KernelConfig(cpu_ops=False)}


def load(path, selected):
    """(model, cfg) from an HF directory with the given `kernels.select` result."""
    cfg = ModelConfig.from_file(str(path))
    model = build_model(cfg, selected)
    load_weights(model, path, use="inference")
    return model, cfg


def production_loss(model, ids, labels, **doc):
    """(loss, per-token losses `[bsz, seq_len]`, NaN where not counted), gradients accumulated on `model`.

    The loss is `model(ids, labels=...)` with its backward, as a training step runs it; each token's loss is
    the same head + loss over the final hidden states with only that label counted (as `eval` runs it)."""
    assert model.kernels.linear_cross_entropy is not None  # the fused head + loss, never the logits
    x = paddle.to_tensor(ids)
    total, count = model(x, labels=paddle.to_tensor(labels), **doc)
    loss = mean_loss(total, count)
    loss.backward()
    per_token = np.full(labels.shape, np.nan, dtype="float64")
    with paddle.no_grad():
        h = model.model(x, None, doc.get("position_ids"), doc.get("doc_start"))  # [bsz, seq_len, hidden]
        for b, t in zip(*np.nonzero(labels != IGNORE_INDEX)):
            one = np.full_like(labels, IGNORE_INDEX)
            one[b, t] = labels[b, t]
            per_token[b, t] = float(model.loss_sum(h, paddle.to_tensor(one))[0])
    return float(loss), per_token


def hf_model(conf, seed: int = 0, gate_scale: float = 0.0, bias_buffer: float = 0.0):
    """transformers' model of config `conf` (CPU fp32, eager attention, eval mode), its weights perturbed after init
    so biases and norm weights are not trivially 0 / 1: + N(0, 0.1²). `gate_scale`: the routers' weights
    (`gate.weight`) + N(0, gate_scale²) too, so the top-k is not a near tie; `bias_buffer`: DeepSeek's
    `e_score_correction_bias` buffers set to N(0, bias_buffer²), a balancing bias that changes which experts win."""
    import torch
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(conf, attn_implementation="eager").float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
            elif gate_scale and name.endswith("gate.weight"):
                p.add_(torch.randn_like(p) * gate_scale)
        if bias_buffer:
            for name, b in model.named_buffers():
                if name.endswith("e_score_correction_bias"):
                    b.copy_(torch.randn_like(b) * bias_buffer)
    return model.eval()


def token_ids(vocab: int, seq: int, seed: int = 1):
    """Two random sequences of `seq` + 1 tokens (inputs and their shifted labels), int64."""
    return np.random.default_rng(seed).integers(0, vocab, (2, seq + 1)).astype("int64")


def hf_loss_backward(model, ids):
    """transformers' (logits, mean loss, per-token losses `[bsz, seq]`, named parameters with their gradients) on
    `ids[:, :-1]` against `ids[:, 1:]`: plain cross-entropy, the loss backpropagated."""
    import torch

    t = torch.from_numpy(ids)
    out = model(input_ids=t[:, :-1])
    per_token = torch.nn.functional.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]), t[:, 1:].reshape(-1),
                                                  reduction="none")
    loss = per_token.mean()
    loss.backward()
    return (out.logits.detach().numpy(), float(loss.detach()), per_token.detach().numpy().reshape(ids[:, 1:].shape),
            dict(model.named_parameters()))


def hf_per_expert_grads(h_params) -> dict:
    """transformers 5 holds a layer's experts fused (`experts.gate_up_proj` [E, 2F, H], `experts.down_proj`
    [E, H, F]); its on-disk names are per expert. The gradients under those names."""
    out = {}
    for name, p in h_params.items():
        if p.grad is None:
            continue
        g = p.grad.numpy()
        if name.endswith("experts.gate_up_proj"):
            half = g.shape[1] // 2
            for e in range(g.shape[0]):
                out[name.replace("gate_up_proj", f"{e}.gate_proj.weight")] = g[e, :half]
                out[name.replace("gate_up_proj", f"{e}.up_proj.weight")] = g[e, half:]
        elif name.endswith("experts.down_proj"):
            for e in range(g.shape[0]):
                out[name.replace("down_proj", f"{e}.down_proj.weight")] = g[e]
        else:
            out[name] = g
    return out


def export_loads_in_transformers(src, out, ids):
    """Our model read from the HF directory `src`, its weights moved (so the export cannot coincide with the source
    by accident), exported to `out` by `convert.save_hf` and read back by transformers: its logits on `ids[:, :-1]`
    equal ours (≤ 1e-4). Returns (ours, cfg, transformers' model)."""
    import torch
    import transformers

    ours, cfg = load(src, None)
    with paddle.no_grad():
        for p in ours.parameters():
            p.set_value(p + 0.01 * paddle.randn(p.shape))
    convert.save_hf(ours, cfg, str(out))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), attn_implementation="eager").eval()
    with torch.no_grad():
        h_logits = hf(input_ids=torch.from_numpy(ids[:, :-1])).logits.numpy()
    assert np.abs(ours(paddle.to_tensor(ids[:, :-1])).numpy() - h_logits).max() <= 1e-4
    return ours, cfg, hf
