"""A dense model with multi-token prediction (no sparse layer: DeepSeek-V3 with `first_k_dense_replace` past its MTP
module's layer, or Qwen2 carrying `num_nextn_predict_layers`) on several processes, through the real launcher,
equal to one process: every step's loss, logged `mtp_loss` and `lm_loss` and gradient norm, and the final weights.

Its log line reads the MTP and LM losses apart (`models.moe_loss.log_values`), which also asked the layout for the
whole model's per-layer expert load (`Strategy.whole_model_rows`): a model without experts has none, and on gloo
the all-reduce of that empty array died at the first log line (gloo's `opts.elements > 0`, a traceback on every
rank, every layout below). The log step now gathers expert counts only for a model that has experts.

- dp2 (`paddle.DataParallel`) and cp2 on DeepSeek-V3 made dense (`micro-deepseek-v3`, first_k_dense_replace 3);
- pp2 (fleet's 1F1B, the module on the last stage), tp2 (the semi-auto engine) and tp2 with sequence parallelism
  (the `tp` step) on Qwen2 with one MTP module (`micro-qwen2` + num_nextn_predict_layers 1, its head tied to the
  embedding). Under sequence parallelism the MTP module's layer got the decoder layers' regions but a whole input,
  which its attention gathered to twice the sequence ('rope: cos/sin must be [seq_len, head_dim]'): its input is now
  cut and its output made whole as the decoder's, its norms' gradients summed over the tp group
  (`distributed.steps.sequence_parallel.hook_model`; unsummed, its layer norm's weight ends 5.7e-3 off in 3 steps).

And in one process, without a launch: the log line of a dense MTP model asks no collective of the layout, and a
pipeline's gather of the load rows makes no zero-element one (each all-reduce here refuses one, as gloo does).
"""
from __future__ import annotations

import json

import pytest

from against_one_process import WEIGHT_TOL, assert_steps_match, launch_layouts
from launch_helpers import assert_close_tensors, logged, read_weights

# 3 steps, each clipped (the norms are ~0.8-0.9): a wrong gradient or update shows in the next step's loss and norm
STEPS = 3
KEYS = dict(max_steps=STEPS, max_grad_norm=0.5)
MICRO = dict(per_device_train_batch_size=2, gradient_accumulation_steps=4)  # the pipeline's micro-batches
ONE = dict(per_device_train_batch_size=8)
# name -> (model, processes, layout keys, one process's keys: the same global batch)
LAYOUTS = {
    "dp2": ("v3_dense", 2, dict(per_device_train_batch_size=4), ONE),
    "cp2": ("v3_dense", 2, dict(context_parallel_degree=2, per_device_train_batch_size=8), ONE),
    "pp2": ("qwen2_mtp", 2, dict(MICRO, pipeline_parallel_degree=2), MICRO),
    "tp2": ("qwen2_mtp", 2, dict(tensor_parallel_degree=2, per_device_train_batch_size=8), ONE),
    "tp2_sp": ("qwen2_mtp", 2, dict(tensor_parallel_degree=2, sequence_parallel=True, per_device_train_batch_size=8),
               ONE),
}
LOGGED = ("mtp_loss", "lm_loss")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict:
    """{"v3_dense": micro-deepseek-v3 with every layer dense, its MTP module's too; "qwen2_mtp": micro-qwen2 with one
    MTP module}: each as a local model directory's keys, with `KEYS`."""
    from pretrain_cli.config.presets import PRESET_DIR

    v3 = json.loads((PRESET_DIR / "micro-deepseek-v3" / "config.json").read_text())
    qwen2 = json.loads((PRESET_DIR / "micro-qwen2" / "config.json").read_text())
    out = {}
    for name, cfg in (("v3_dense", dict(v3, first_k_dense_replace=3)),
                      ("qwen2_mtp", dict(qwen2, num_nextn_predict_layers=1))):
        model = tmp_path_factory.mktemp(name)
        (model / "config.json").write_text(json.dumps(cfg))
        out[name] = dict(KEYS, model_name_or_path=str(model))
    return out


@pytest.fixture(scope="module")
def runs(corpus, shared, models, tmp_path_factory):
    """name -> ((one process's run, its output dir), (the launch, its output dir))."""
    layouts = {name: (models[model], nproc, layout, one) for name, (model, nproc, layout, one) in LAYOUTS.items()}
    return launch_layouts(layouts, tmp_path_factory.mktemp("mtp_dense"), corpus, shared, check=False)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_a_dense_model_with_mtp_trains_on_several_processes_as_on_one(runs, name):
    """Every step's loss, logged MTP and LM losses and gradient norm as one process's, the final weights too (the
    MTP module's among them)."""
    (ref, rout), (run, out) = runs[name]
    assert run.returncode == 0, run.explain()
    # (the gradient norm clipped at 0.5: it steers)
    assert_steps_match(run, ref, STEPS, LAYOUTS[name][1], LOGGED, shares=False, grad_tol=1e-5, relative=True)
    assert all(v > 1.0 for v in logged(ref.log(0), "mtp_loss").values())  # a real cross-entropy, not a missing term
    assert "moe_expert_share" not in run.log(0)  # no experts, no expert load
    weights = read_weights(out)
    assert "model.layers.2.eh_proj.weight" in weights
    assert_close_tensors(weights, read_weights(rout), WEIGHT_TOL)


def _gloo_all_reduce(reduced: list):
    """`dist.all_reduce` as gloo takes it: recorded, the tensor left as it is (a group of one), a zero-element one
    refused with gloo's words."""
    def all_reduce(t, op=None, **kw):
        if not t.size:
            raise RuntimeError("[enforce fail at gloo/allreduce.cc:105] opts.elements > 0.")
        reduced.append(list(t.shape))
    return all_reduce


def test_the_log_line_of_a_dense_mtp_model_gathers_no_expert_load(monkeypatch):
    """`log_values` on two ranks: the logged losses all-reduced once, and no expert load asked of the layout (it
    all-reduced an empty `[0, 1]` array: gloo's assertion on every rank at the first log line)."""
    from types import SimpleNamespace

    import numpy as np
    import paddle
    import paddle.distributed as dist

    from pretrain_cli.distributed.strategies.strategy import LOGGED, Strategy
    from pretrain_cli.models import build_model
    from pretrain_cli.models.config import ModelConfig
    from pretrain_cli.models.moe_loss import log_values

    cfg = ModelConfig(model_type="qwen2", vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                      num_nextn_predict_layers=1)
    paddle.seed(0)
    model = build_model(cfg, None)
    ids = paddle.to_tensor(np.random.default_rng(0).integers(0, 64, (2, 9)).astype("int64"))
    model.train()
    model(ids[:, :-1], labels=ids[:, 1:])
    reduced = []
    monkeypatch.setattr(dist, "all_reduce", _gloo_all_reduce(reduced))
    strategy = object.__new__(Strategy)  # the parts the log reads: two ranks
    strategy.parallel, strategy.global_batch = SimpleNamespace(world_size=2), False
    values = log_values(model, strategy)
    assert set(values) == {"mtp_loss", "lm_loss"} and values["mtp_loss"] > 1.0
    assert reduced == [[2 * len(LOGGED)]]  # the logged losses' sums only


def test_a_pipeline_gathers_no_empty_load_rows(monkeypatch):
    """`Pipeline.whole_model_rows`: a stage without sparse layers (DeepSeek's first) puts no rows in, the others'
    are gathered; with no rows on any stage the rows' all-reduce is skipped on every rank alike."""
    from types import SimpleNamespace

    import numpy as np

    import paddle.distributed as dist

    from pretrain_cli.distributed.strategies.pipeline import Pipeline

    sizes = {}  # the stages' row counts every rank agrees on (the first all-reduce, MAX)

    def all_reduce(t, op=None, **kw):
        if list(t.shape) == [2]:  # the sizes: this rank's, with the other stage's put in
            t.set_value(t + np.array(sizes["other"], dtype="float32"))
        return _gloo_all_reduce(reduced)(t, op)

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    piped = object.__new__(Pipeline)  # the first stage of two
    piped.parallel, piped.topology = SimpleNamespace(world_size=2, pp_degree=2), SimpleNamespace(stage=0)
    empty = np.zeros([0, 9], dtype="float32")  # [layers, experts + 1]: no sparse layer on this stage
    reduced, sizes["other"] = [], [0, 1]  # the last stage holds one sparse layer
    assert piped.whole_model_rows(empty).shape == (1, 9) and reduced == [[2], [1, 9]]
    reduced, sizes["other"] = [], [0, 0]  # no stage has one
    assert piped.whole_model_rows(empty).shape == (0, 9) and reduced == [[2]]
