"""`convert.write_hf_dir` killed part way over an earlier model: each state it can leave is the earlier model, the
new one, or no model (every loader fails), and the loaders agree. Writing first and removing the earlier files last
left, killed between the two, an old model.safetensors beside the new shards and index: transformers read the old
model, our loader (`eval --model`) the new one, neither saying so. Over a user's model_ema.safetensors beside
config.json (no model), our loader read it as the model, and with the first new shard beside it a mix of both."""
import os
import shutil

import numpy as np
import pytest

from pretrain_cli import atomic, runtime

paddle = runtime.import_paddle()

import torch  # noqa: E402
import transformers  # noqa: E402

from pretrain_cli.models import build_model, convert  # noqa: E402
from pretrain_cli.models.config import ModelConfig  # noqa: E402
from pretrain_cli.storage import shard_files  # noqa: E402
from pretrain_cli.training.weight_source import load_weights  # noqa: E402
from state_helpers import hf_state_dict  # noqa: E402

CFG = ModelConfig(model_type="qwen2", vocab_size=51, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32, tie_word_embeddings=True,
                  bos_token_id=1, eos_token_id=2)
# max_shard_bytes: 3 shards of this model, 2, or one file
SHARDED, TWO, WHOLE = 8000, 12000, convert.DEFAULT_MAX_SHARD_BYTES


class Killed(Exception):
    """The process stopped at this removal or write (an atomic write publishes whole or not at all)."""


def _model(seed):
    paddle.seed(seed)
    return build_model(CFG)


def _kill_at(monkeypatch, at: int) -> list:
    """Removals and writes (of weights, index and config) pass until the `at`-th, which raises `Killed`."""
    done = []

    def counted(fn):
        def call(*a, **k):
            if len(done) == at:
                raise Killed
            done.append(os.path.basename(str(a[0])))
            return fn(*a, **k)
        return call

    monkeypatch.setattr(os, "remove", counted(os.remove))
    monkeypatch.setattr(shard_files, "write", counted(shard_files.write))
    monkeypatch.setattr(atomic, "write_json", counted(atomic.write_json))
    return done


def _read(d) -> dict:
    """What each loader reads from `d`: its weights by name (HF layout), or None where it fails."""
    got = {}
    for how, kw in (("transformers", {}), ("transformers .bin", {"use_safetensors": False})):
        try:
            sd = transformers.AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32, **kw).state_dict()
            got[how] = {n: t.detach().numpy() for n, t in sd.items()}
        except Exception:  # noqa: BLE001 (any failure to load is loud: the user learns there is no model)
            got[how] = None
    mine = _model(9)
    try:
        load_weights(mine, str(d), use="continue_training")
        got["ours"] = {n: t.numpy() for n, t in hf_state_dict(mine).items()}
    except Exception:  # noqa: BLE001
        got["ours"] = None
    return got


def _which(weights, old, new) -> str:
    for name, model in (("old", old), ("new", new)):
        if all(np.array_equal(weights[n], t) for n, t in model.items()):
            return name
    return "another"


@pytest.mark.parametrize("before", ["whole, with pytorch_model.bin", "2 shards", "3 shards", "model_ema alone"])
@pytest.mark.parametrize("after", [WHOLE, SHARDED])
def test_a_kill_anywhere_leaves_one_model_or_none(tmp_path, monkeypatch, before, after):
    earlier, later = _model(1), _model(2)
    pristine = tmp_path / "earlier"
    limit = {"2 shards": TWO, "3 shards": SHARDED}.get(before, WHOLE)
    convert.save_hf(earlier, CFG, str(pristine), max_shard_bytes=limit)
    old = {n: t.numpy() for n, t in hf_state_dict(earlier).items()}
    new = {n: t.numpy() for n, t in hf_state_dict(later).items()}
    if before.startswith("whole"):
        torch.save({n: torch.from_numpy(a.copy()) for n, a in old.items()}, pristine / "pytorch_model.bin")
    if before == "model_ema alone":  # a user's weights beside config.json, under a name that is no model's
        os.rename(pristine / "model.safetensors", pristine / "model_ema.safetensors")
    states, at = [], 0
    while True:
        d = tmp_path / f"at{at}"
        shutil.copytree(pristine, d)
        done = _kill_at(monkeypatch, at)
        try:
            convert.save_hf(later, CFG, str(d), max_shard_bytes=after)
            finished = True
        except Killed:
            finished = False
        monkeypatch.undo()
        read = {how: None if w is None else _which(w, old, new) for how, w in _read(d).items()}
        states.append((done, read))
        models = set(read.values()) - {None}
        assert len(models) <= 1 and "another" not in models, (done, read)  # one model, or loud failures
        if finished:
            break
        at += 1
    first = {"transformers": None, "transformers .bin": None, "ours": None} if before == "model_ema alone" else \
        {"transformers": "old", "transformers .bin": "old" if before.startswith("whole") else None, "ours": "old"}
    assert states[0][1] == first and states[-1][1] == {"transformers": "new", "ours": "new",
                                                       "transformers .bin": None}, states
    seen = [m for _, r in states for m in r.values() if m is not None]
    assert seen == sorted(seen, key=["old", "new"].index), states  # (never the earlier model after the new one)
