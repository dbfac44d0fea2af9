"""The parallel layouts on GPUs (NCCL, no CPU gradient hook, reduce-scatter of gradients): what CPU CI cannot run.

Needs a GPU build of Paddle and 2 GPUs (4 for dp2 x tp2, pp2 x stage2 and tp2 x pp2, 8 for tp2 x pp2 x dp2 /
stage1). Run on such a machine with

    python -m pytest tests/gpu/test_layouts_gpu.py -v

Each layout trains the same 10 steps as one GPU at the same global batch, in fp32 (losses within 1e-4:
NCCL and cuBLAS reduce in other orders than gloo and MKL), and the bf16/fp16 files train and save.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()
pytestmark = pytest.mark.gpu
if not paddle.is_compiled_with_cuda():  # pragma: no cover - a collection error, not a silent skip
    raise RuntimeError("tests/gpu needs a GPU build of Paddle and GPUs; scripts/test.sh leaves this directory out")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
from launch_helpers import launch_cmd, parse_losses, read_weights, write_config, write_corpus  # noqa: E402
from layouts import HALF, LAYOUTS, MODEL_KEYS  # noqa: E402  (the table scripts/gpu_check.sh selects from by GPU count)

GPUS = paddle.device.cuda.device_count()


def _run(cfg: Path, gpus: int, log_dir: Path, extra=()) -> str:
    cmd = launch_cmd(cfg, log_dir, extra=extra, devices=",".join(str(i) for i in range(gpus)))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=dict(os.environ))
    log = (log_dir / "workerlog.0").read_text(errors="replace") if (log_dir / "workerlog.0").is_file() else ""
    assert proc.returncode == 0, proc.stderr[-3000:] + log[-3000:]
    return log


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu_corpus")
    write_corpus(root / "data" / "walk")
    return root / "data"


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    """`reference(**model_keys)`: (losses, final weights) of one GPU at the global batch of 8 on the model those
    keys choose (none: the dense micro-qwen2), each run once."""
    runs = {}

    def run(**model):
        key = tuple(sorted(model.items()))
        if key not in runs:
            root = tmp_path_factory.mktemp("ref")
            cfg = write_config(root / "ref.json", corpus, root / "out", device="gpu", per_device_train_batch_size=8,
                               **model)
            runs[key] = parse_losses(_run(cfg, 1, root / "log")), read_weights(root / "out")
        return runs[key]

    return run


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_layout_matches_one_gpu(corpus, reference, tmp_path, name):
    nproc, keys = LAYOUTS[name]
    if GPUS < nproc:  # scripts/gpu_check.sh runs only the layouts that fit and names the others
        raise RuntimeError(f"{name} needs {nproc} GPUs, this machine has {GPUS}")
    cfg = write_config(tmp_path / "c.json", corpus, tmp_path / "out", device="gpu", **keys)
    losses = parse_losses(_run(cfg, nproc, tmp_path / "log"))
    want, weights = reference(**{k: v for k, v in keys.items() if k in MODEL_KEYS})
    assert sorted(losses) == sorted(want)
    assert max(abs(losses[s] - want[s]) for s in want) <= 1e-4
    got = read_weights(tmp_path / "out")
    assert max(float(abs(got[k] - weights[k]).max()) for k in got) <= 1e-3


@pytest.mark.parametrize("name", sorted(HALF))
def test_half_precision_layouts_train_and_save(corpus, tmp_path, name):
    """bf16 O2 under TP + ZeRO-3, PaddleNLP's fp16 O2 + stage2 (the loss scaler wrapped by dist.shard_scaler), and
    bf16 under context parallelism (flash attention's per-block output and log-sum-exp, `kernels.attention_block`)."""
    nproc, keys = HALF[name]
    if GPUS < nproc:
        raise RuntimeError(f"{name} needs {nproc} GPUs, this machine has {GPUS}")
    cfg = write_config(tmp_path / "c.json", corpus, tmp_path / "out", device="gpu", use_flash_attention=True, **keys)
    losses = parse_losses(_run(cfg, nproc, tmp_path / "log"))
    assert len(losses) == 10 and losses[10] < losses[1]
    assert json.loads((tmp_path / "out" / "config.json").read_text())["torch_dtype"] in ("bfloat16", "float16")
