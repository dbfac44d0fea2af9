"""training.routing_watch and the train log's use of it: a MoE layer collapsed onto one expert for two log intervals
in a row is warned of once, by its layer, share and the balancing keys; a single interval is not."""
import logging
from types import SimpleNamespace

from pretrain_cli.models import moe_loss
from pretrain_cli.training.routing_watch import CollapseWatch
from pretrain_cli.training.train_log import TrainLog


def test_two_intervals_in_a_row_warn_once_per_layer():
    w = CollapseWatch(experts=16, top_k=4, layers=[0, 1, 2, 3])
    # docs/MOE.md's router_aux_loss_coef 0.01 run, steps 40-100: layer 3 at 0.2327 then 0.25
    assert w.see([0.2177, 0.2165, 0.2224, 0.2327]) == []
    assert w.see([0.1703, 0.2072, 0.1806, 0.25]) == [(3, 0.25)]
    assert w.see([0.1311, 0.1658, 0.1563, 0.249]) == []  # warned once
    # its 0.1 run: layer 2 at 0.216, 0.2404, 0.19: one interval near 1/top_k is a swing
    w = CollapseWatch(experts=16, top_k=4)
    assert [w.see(x) for x in ([0.15, 0.18, 0.216, 0.13], [0.13, 0.21, 0.2404, 0.178], [0.12, 0.18, 0.19, 0.19])] \
        == [[], [], []]


def test_layer_names_are_the_models_and_balance_at_top_k_experts_is_not_collapse():
    w = CollapseWatch(experts=8, top_k=1, layers=[1, 3])  # e.g. decoder_sparse_step 2
    w.see([0.95, 0.2])
    assert w.see([0.97, 0.2]) == [(1, 0.97)]
    same = CollapseWatch(experts=4, top_k=4)  # every expert in every token's choice: 0.25 each, always
    assert same.see([0.25]) == [] and same.see([0.25]) == []


def test_message_names_the_keys_in_effect():
    w = CollapseWatch(experts=16, top_k=4)
    off = w.message(60, 3, 0.2498, 0.0, 0.001)
    assert off.startswith("step 60: MoE layer 3 routes nearly every token to one expert: its busiest expert's "
                          "share 0.2498 for 2 log intervals in a row (1/top_k = 0.25, balanced 0.0625)")
    assert "set moe_router_bias_update_rate 0.001" in off and "router_aux_loss_coef (now 0.001)" in off
    assert "raise moe_router_bias_update_rate (now 0.001)" in w.message(60, 3, 0.2498, 0.001, 0.001)


class _Log(TrainLog):
    """A trainer as far as `_log` reads it: a tiny Qwen3-MoE's config, one process, no writer of files."""

    def __init__(self, events):
        cfg = SimpleNamespace(sparse_layers=[0, 1], num_nextn_predict_layers=0, num_experts=16,
                              num_experts_per_tok=4, expert_layers=[0, 1], router_aux_loss_coef=0.001)
        model = SimpleNamespace(config=cfg, moe=SimpleNamespace(bias_update_rate=0.0, aux_loss_coef=None,
                                                                 z_loss_coef=0.0))
        self.layout, self.state = SimpleNamespace(raw_model=model, strategy=None), SimpleNamespace(
            interval_loss=8.0, interval_steps=2, loss_sum=0.0, global_step=0, tokens_seen=0, consumed_samples=0,
            last_batch_hash="", log_history=[])
        self.comm = SimpleNamespace(mean=lambda x: x)
        self.schedule = SimpleNamespace(lr_at=lambda step: 1e-3, phase=lambda step: None)
        self.throughput = SimpleNamespace(time_remaining=lambda n: 0.0, interval=dict)
        self.loop, self.device, self.writer = SimpleNamespace(memory_metrics=False, max_steps=100), "cpu", None
        self.events = events

    def record_event(self, kind, values, step=None):
        self.events.append((kind, self.state.global_step, values))


def test_train_log_warns_and_records_a_collapse(monkeypatch, caplog):
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
    assert len(warned) == 1 and warned[0].startswith("step 40: MoE layer 1 routes nearly every token to one expert")
    assert events == [("routing_collapse", 40, {"layer": 1, "max_expert_share": 0.2499, "top_k": 4, "experts": 16,
                                                "moe_router_bias_update_rate": 0.0, "router_aux_loss_coef": 0.001})]
