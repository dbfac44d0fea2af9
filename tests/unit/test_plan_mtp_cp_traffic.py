"""DeepSeek-V3's multi-token prediction under context parallelism in the speed model: each depth's input ids and
labels, int64, all-gathered over the cp group every micro-batch (`distributed.steps.context_shift.NextTokens`),
are in the last stage's `cp` traffic (`planning.context.mtp_shift_bytes`); a model without the modules sends none."""
import dataclasses
import json
import tempfile
from pathlib import Path

import pytest

from pretrain_cli.config.presets import PRESET_DIR
from pretrain_cli.models.config import ModelConfig
from pretrain_cli.orchestration.planned import from_file
from pretrain_cli.planning import speed
from pretrain_cli.planning.context import mtp_shift_bytes

LLAMA = Path(__file__).resolve().parents[1] / "e2e" / "paddlenlp_configs" / "llama_pretrain_argument.json"
V3 = ModelConfig.from_file(str(PRESET_DIR / "micro-deepseek-v3"))


def test_the_next_tokens_gather_is_two_int64_fields_a_depth_from_every_other_rank():
    """Per micro-batch a rank sends its [b, S/C] ids and labels to each of the C-1 others, per depth: 2 x 2 x 1 x
    256 x 8 bytes at b 2, S 512, C 2, one depth; twice that with two depths; nothing without cp or the modules."""
    assert V3.num_nextn_predict_layers == 1
    assert mtp_shift_bytes(V3, 2, 512, 2) == 2 * 1 * 1 * 2 * 256 * 8
    assert mtp_shift_bytes(dataclasses.replace(V3, num_nextn_predict_layers=2), 2, 512, 4) == 2 * 2 * 3 * 2 * 128 * 8
    assert mtp_shift_bytes(V3, 2, 512, 1) == 0
    assert mtp_shift_bytes(dataclasses.replace(V3, num_nextn_predict_layers=0), 2, 512, 2) == 0


def _plan(depths: int, pp: int = 1):
    d = Path(tempfile.mkdtemp()) / "v3"
    d.mkdir()
    conf = json.loads((PRESET_DIR / "micro-deepseek-v3" / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**conf, "num_hidden_layers": 4, "num_nextn_predict_layers": depths}))
    args = ["--model_name_or_path", str(d), "--tensor_parallel_degree", "1", "--sharding", "",
            "--context_parallel_degree", "2", "--pipeline_parallel_degree", str(pp), "--max_seq_length", "512",
            "--gradient_accumulation_steps", "4", "--per_device_train_batch_size", "2"]
    return from_file(str(LLAMA), args, device="H100", gpus=2 * pp, suggest_changes=False)


@pytest.mark.parametrize("pp", [1, 2])
def test_the_last_stages_cp_traffic_and_step_carry_the_gather(monkeypatch, pp):
    """cp 2 (x pp 2), 4 micro-batches: the last stage's cp bytes are the ring's plus 4 x `mtp_shift_bytes`, and the
    step's time grows by them over the cp link; the other stage sends none of it. Uncounted before."""
    with_gather = _plan(1, pp)
    monkeypatch.setattr(speed, "mtp_shift_bytes", lambda *a: 0.0)
    without = _plan(1, pp)
    cp = [a["traffic_gb_per_step"]["cp"] - b["traffic_gb_per_step"]["cp"]
          for a, b in zip(with_gather.stages, without.stages)]
    assert cp[-1] * 1e9 == pytest.approx(4 * mtp_shift_bytes(V3, 2, 512, 2)) and all(x == 0 for x in cp[:-1])
    assert speed.speed(with_gather)["rank_seconds"] > speed.speed(without)["rank_seconds"]
