"""training.routing_watch and the train log's use of it: a MoE layer collapsed onto one expert for two log intervals
in a row after twice the warm-up is warned of once, by its layer, share and the balancing keys; a single interval,
or the first split of a router trained from scratch, is not."""
import logging
from types import SimpleNamespace

from pretrain_cli.models import moe_loss
from pretrain_cli.training.routing_watch import CollapseWatch
from pretrain_cli.training.train_log import TrainLog


def test_two_intervals_in_a_row_warn_once_per_layer():
    w = CollapseWatch(experts=16, top_k=4, layers=[0, 1, 2, 3])
    # docs/MOE.md's router_aux_loss_coef 0.01 run, steps 40-100: layer 3 at 0.2327 then 0.25
    assert w.see([0.2177, 0.2165, 0.2224, 0.2327], 40) == []
    assert w.see([0.1703, 0.2072, 0.1806, 0.25], 60) == [(3, 0.25)]
    assert w.see([0.1311, 0.1658, 0.1563, 0.249], 80) == []  # warned once
    # its 0.1 run: layer 2 at 0.216, 0.2404, 0.19: one interval near 1/top_k is a swing
    w = CollapseWatch(experts=16, top_k=4)
    assert [w.see(x, s) for s, x in ((40, [0.15, 0.18, 0.216, 0.13]), (60, [0.13, 0.21, 0.2404, 0.178]),
                                     (80, [0.12, 0.18, 0.19, 0.19]))] == [[], [], []]


def test_a_router_from_scratch_is_judged_after_twice_the_warmup():
    """configs/qwen3-moe-tiny_cpu.json (warmup 20, logged every 10 steps): three layers at 0.24-0.25 from step 20 on,
    in every run of the shipped example, warned of at step 30-40; the same shares after step 40 are a collapse."""
    early = [(10, [0.0885, 0.2408, 0.2432, 0.2408]), (20, [0.2305, 0.2484, 0.2489, 0.2489]),
             (30, [0.2263, 0.25, 0.25, 0.25]), (40, [0.1935, 0.2152, 0.25, 0.25])]
    w = CollapseWatch(experts=16, top_k=4, layers=[0, 1, 2, 3], warmup_steps=20)
    assert [w.see(x, s) for s, x in early] == [[], [], [], []]
    assert w.see([0.1746, 0.2318, 0.2499, 0.2499], 50) == []  # the first interval judged
    assert w.see([0.1644, 0.2374, 0.2494, 0.2493], 60) == [(1, 0.2374), (2, 0.2494), (3, 0.2493)]
    late = CollapseWatch(experts=16, top_k=4, warmup_steps=20)  # one that comes later is warned of too
    assert [late.see([0.1, share], s) for s, share in ((500, 0.24), (510, 0.25))] == [[], [(1, 0.25)]]


def test_layer_names_are_the_models_and_balance_at_top_k_experts_is_not_collapse():
    w = CollapseWatch(experts=8, top_k=1, layers=[1, 3])  # e.g. decoder_sparse_step 2
    w.see([0.95, 0.2], 10)
    assert w.see([0.97, 0.2], 20) == [(1, 0.97)]
    same = CollapseWatch(experts=4, top_k=4)  # every expert in every token's choice: 0.25 each, always
    assert same.see([0.25], 10) == [] and same.see([0.25], 20) == []


def test_the_warning_names_the_decoder_layer_as_transformers_does():
    """micro DeepSeek-V3 (first_k_dense_replace 1, one MTP module): its sparse layers are decoder layers 1-3 and the
    MTP module's layer 4, as `model.layers.N` in its parameter names; the first sparse layer is not "layer 0"."""
    w = CollapseWatch(experts=16, top_k=4, layers=[1, 2, 3, 4], decoder_layers=4)
    w.see([0.24, 0.1, 0.1, 0.24], 10)
    assert w.see([0.25, 0.1, 0.1, 0.25], 20) == [(1, 0.25), (4, 0.25)]
    assert w.message(20, 1, 0.25, 0.001, 0.0).startswith("step 20: model.layers.1.mlp routes nearly every token")
    assert w.message(20, 4, 0.25, 0.001, 0.0).startswith("step 20: model.layers.4.mlp (the MTP module's) routes")
    unnamed = CollapseWatch(experts=16, top_k=4, layers=[1, 2])  # shares of another count: said as a count
    unnamed.see([0.25], 10)
    assert unnamed.see([0.25], 20) == [(0, 0.25)]
    assert "sparse layer 0 (counted among the sparse layers)" in unnamed.message(20, 0, 0.25, 0.0, 0.001)


def test_message_names_the_keys_in_effect():
    w = CollapseWatch(experts=16, top_k=4, layers=[0, 1, 2, 3])
    off = w.message(60, 3, 0.2498, 0.0, 0.001)
    assert off.startswith("step 60: model.layers.3.mlp routes nearly every token to one expert: its busiest "
                          "expert's share 0.2498 for 2 log intervals in a row (1/top_k = 0.25, balanced 0.0625)")
    assert "set moe_router_bias_update_rate 0.001" in off and "router_aux_loss_coef (now 0.001)" in off
    assert "raise moe_router_bias_update_rate (now 0.001)" in w.message(60, 3, 0.2498, 0.001, 0.001)


def test_message_quotes_this_runs_numbers_alone():
    """An 8-expert top-2 Qwen2-MoE: balanced 0.125; the line quoted the tiny 16-expert model's 0.076 against 0.0625
    from docs/MOE.md beside it. It points to the doc's section instead."""
    line = CollapseWatch(experts=8, top_k=2, layers=[0, 1]).message(30, 1, 0.4996, 0.0, 0.001)
    assert "(1/top_k = 0.5, balanced 0.125)" in line and "0.0625" not in line and "0.076" not in line
    assert line.endswith('; docs/MOE.md, "The routing-collapse warning"')


class _Log(TrainLog):
    """A trainer as far as `_log` reads it: a tiny Qwen3-MoE's config, one process, no writer of files."""

    def __init__(self, events):
        cfg = SimpleNamespace(sparse_layers=[0, 1], num_nextn_predict_layers=0, num_experts=16, num_hidden_layers=2,
                              num_experts_per_tok=4, expert_layers=[0, 1], router_aux_loss_coef=0.001)
        model = SimpleNamespace(config=cfg, moe=SimpleNamespace(bias_update_rate=0.0, aux_loss_coef=None,
                                                                 z_loss_coef=0.0))
        self.layout, self.state = SimpleNamespace(raw_model=model, strategy=None), SimpleNamespace(
            interval_loss=8.0, interval_steps=2, loss_sum=0.0, global_step=0, tokens_seen=0, consumed_samples=0,
            last_batch_hash="", log_history=[])
        self.comm = SimpleNamespace(mean=lambda x: x)
        self.schedule = SimpleNamespace(lr_at=lambda step: 1e-3, phase=lambda step: None, warmup_steps=10)
        self.throughput = SimpleNamespace(time_remaining=lambda n: 0.0, interval=dict)
        self.loop, self.device, self.writer = SimpleNamespace(memory_metrics=False, max_steps=100), "cpu", None
        self.events = events

    def record_event(self, kind, values, step=None):
        self.events.append((kind, self.state.global_step, values))


def test_train_log_warns_and_records_a_collapse(monkeypatch, caplog):
    """Warm-up 10: the interval ending at step 20 is not judged, those at 40 and 60 are."""
    shares = iter([[0.1, 0.24], [0.1, 0.2499], [0.1, 0.25]])
    monkeypatch.setattr(moe_loss, "log_values", lambda model, strategy: {"moe_expert_share_per_layer": next(shares)})
    monkeypatch.setattr(moe_loss, "sparse_blocks", lambda model: [object()])  # router_terms: a transformers block
    events = []
    t = _Log(events)
    with caplog.at_level(logging.WARNING, logger="pretrain_cli"):
        for step in (20, 40, 60):
            t.state.global_step = step
            t._log(grad_norm=1.0)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and warned[0].startswith("step 60: model.layers.1.mlp routes nearly every token")
    assert events == [("routing_collapse", 60, {"layer": 1, "max_expert_share": 0.25, "top_k": 4, "experts": 16,
                                                "moe_router_bias_update_rate": 0.0, "router_aux_loss_coef": 0.001})]
