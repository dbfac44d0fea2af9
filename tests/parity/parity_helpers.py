"""Our model as the product runs it, for the parity tests: built with a kernel selection, the loss from the
fused LM head + loss (what `train` and `eval` run), and each counted token's loss from that same head + loss."""
import numpy as np

from pretrain_cli import runtime

paddle = runtime.import_paddle()

from pretrain_cli.models import build_model  # noqa: E402
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
    load_weights(model, path)
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
