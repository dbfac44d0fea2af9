"""training.routing_watch and the train log's use of it: a MoE layer near 1/top_k in every log line over 20 steps (and
two lines at least) is warned of once, by its layer, share and the balancing keys; a swing, or the early collapse of
a router trained from random init (before max(2 x warm-up, 100 steps)), is not; a trained router has no grace."""
import logging
from types import SimpleNamespace

from log_lines import product_log_lines

from pretrain_cli.models import moe_loss
from pretrain_cli.training.routing_watch import CollapseWatch, steps_before
from pretrain_cli.training.train_log import TrainLog

# configs/qwen3-moe-tiny_cpu.json (warm-up 20), logged every 5 steps, no routing bias: what F3 measured (steps 5-90)
SHIPPED = [(5, [0.072, 0.129, 0.142, 0.138]), (10, [0.088, 0.241, 0.243, 0.241]), (15, [0.118, 0.236, 0.249, 0.249]),
           (20, [0.231, 0.248, 0.249, 0.249]), (25, [0.24, 0.248, 0.249, 0.249]), (30, [0.226, 0.25, 0.25, 0.25]),
           (35, [0.206, 0.246, 0.25, 0.25]), (40, [0.194, 0.215, 0.25, 0.25]), (45, [0.175, 0.232, 0.25, 0.25]),
           (50, [0.164, 0.237, 0.249, 0.249]), (55, [0.15, 0.25, 0.25, 0.25]), (60, [0.152, 0.244, 0.25, 0.25]),
           (65, [0.143, 0.241, 0.233, 0.25]), (70, [0.155, 0.218, 0.15, 0.249]), (75, [0.142, 0.212, 0.143, 0.25]),
           (80, [0.136, 0.191, 0.172, 0.233]), (85, [0.137, 0.161, 0.178, 0.188]), (90, [0.132, 0.173, 0.19, 0.164])]


def _trained(**kw) -> CollapseWatch:
    """A router that starts trained (continue_training): judged from its first line."""
    return CollapseWatch(experts=16, top_k=4, from_init=False, **kw)


def test_a_share_sustained_over_20_steps_warns_once_per_layer():
    w = _trained(layers=[0, 1, 2, 3])
    # docs/MOE.md's router_aux_loss_coef 0.01 run, steps 40-100 (logged every 20): layer 3 at 0.2327 then 0.25
    assert w.see([0.2177, 0.2165, 0.2224, 0.2327], 40) == []
    assert w.see([0.1703, 0.2072, 0.1806, 0.25], 60) == [(3, 0.25)]
    assert w.see([0.1311, 0.1658, 0.1563, 0.249], 80) == []  # warned once
    # its 0.1 run: layer 2 at 0.216, 0.2404, 0.19: one interval near 1/top_k is a swing
    w = _trained()
    assert [w.see(x, s) for s, x in ((40, [0.15, 0.18, 0.216, 0.13]), (60, [0.13, 0.21, 0.2404, 0.178]),
                                     (80, [0.12, 0.18, 0.19, 0.19]))] == [[], [], []]


def test_the_span_is_steps_not_log_lines():
    """Two lines were 10 steps at logging_steps 5 and 40 at 20: now 20 steps either way (and 2 lines at least)."""
    every5 = _trained()
    assert [every5.see([0.1, 0.25], s) for s in (200, 205, 210, 215)] == [[], [], [], []]  # 15 steps since 200
    assert every5.see([0.1, 0.25], 220) == [(1, 0.25)]
    every20 = _trained()
    assert [every20.see([0.1, x], s) for s, x in ((200, 0.1), (220, 0.25), (240, 0.25))] == [[], [], [(1, 0.25)]]
    once = _trained()  # one 30-step interval near 1/top_k is one share: not yet a verdict
    assert [once.see([0.1, x], s) for s, x in ((200, 0.1), (230, 0.25))] == [[], []]
    swing = _trained()  # a dip under the bar starts the span again
    assert [swing.see([0.1, x], s) for s, x in ((200, 0.25), (210, 0.2), (215, 0.25), (225, 0.25))] == [[]] * 4


def test_a_router_from_init_is_judged_after_its_grace():
    """The shipped example at logging_steps 5 (layer 3 at 0.225 or more until step 80) warned at step 50 when judged
    from 2 x warm-up: from init it is judged after max(2 x 20, 100) steps, so never; the same shares from a trained
    router (continue_training) are a collapse from the start."""
    w = CollapseWatch(experts=16, top_k=4, layers=[0, 1, 2, 3], warmup_steps=20)
    assert w.from_step == 100 and [w.see(x, s) for s, x in SHIPPED] == [[]] * len(SHIPPED)
    trained = _trained(layers=[0, 1, 2, 3], warmup_steps=20)
    warned = [(s, out) for s, x in SHIPPED if (out := trained.see(x, s))]
    assert warned[0] == (25, [(1, 0.248), (2, 0.249), (3, 0.249)]), warned
    assert CollapseWatch(experts=16, top_k=4, warmup_steps=200).from_step == 400  # a longer warm-up: twice it
    late = CollapseWatch(experts=16, top_k=4, warmup_steps=20)  # one that comes after the grace is warned of
    assert [late.see([0.1, x], s) for s, x in ((95, 0.25), (100, 0.25), (110, 0.25), (120, 0.25))] == [
        [], [], [], [(1, 0.25)]]  # judged from the interval that begins at step 100


def test_layer_names_are_the_models_and_balance_at_top_k_experts_is_not_collapse():
    w = CollapseWatch(experts=8, top_k=1, layers=[1, 3], from_init=False)  # e.g. decoder_sparse_step 2
    w.see([0.95, 0.2], 10)
    assert w.see([0.97, 0.2], 30) == [(1, 0.97)]
    same = CollapseWatch(experts=4, top_k=4, from_init=False)  # every expert in every token's choice: 0.25 each
    assert [same.see([0.25], s) for s in (10, 20, 30, 40)] == [[]] * 4


def test_the_warning_names_the_decoder_layer_as_transformers_does():
    """micro DeepSeek-V3 (first_k_dense_replace 1, one MTP module): its sparse layers are decoder layers 1-3 and the
    MTP module's layer 4, as `model.layers.N` in its parameter names; the first sparse layer is not "layer 0"."""
    w = _trained(layers=[1, 2, 3, 4], decoder_layers=4)
    w.see([0.24, 0.1, 0.1, 0.24], 10)
    assert w.see([0.25, 0.1, 0.1, 0.25], 30) == [(1, 0.25), (4, 0.25)]
    assert w.message(30, 1, 0.25, 0.001, 0.0).startswith("step 30: model.layers.1.mlp routes nearly every token")
    assert w.message(30, 4, 0.25, 0.001, 0.0).startswith("step 30: model.layers.4.mlp (the MTP module's) routes")
    unnamed = _trained(layers=[1, 2])  # shares of another count: said as a count
    unnamed.see([0.25], 10)
    assert unnamed.see([0.25], 30) == [(0, 0.25)]
    assert "sparse layer 0 (counted among the sparse layers)" in unnamed.message(30, 0, 0.25, 0.0, 0.001)


def test_message_names_the_span_and_the_keys_in_effect():
    w = _trained(layers=[0, 1, 2, 3])
    w.see([0.1, 0.1, 0.1, 0.24], 40)
    w.see([0.1, 0.1, 0.1, 0.2498], 60)
    off = w.message(60, 3, 0.2498, 0.0, 0.001)
    assert off.startswith("step 60: model.layers.3.mlp routes nearly every token to one expert: its busiest "
                          "expert's share 0.2498, at 0.9 x 1/top_k or more since step 40 (2 log lines; 1/top_k = "
                          "0.25, balanced 0.0625)"), off
    assert "set moe_router_bias_update_rate 0.001" in off and "router_aux_loss_coef (now 0.001)" in off
    assert "raise moe_router_bias_update_rate (now 0.001)" in w.message(60, 3, 0.2498, 0.001, 0.001)


def test_message_quotes_this_runs_numbers_alone():
    """An 8-expert top-2 Qwen2-MoE: balanced 0.125; the line quoted the tiny 16-expert model's 0.076 against 0.0625
    from docs/MOE.md beside it. It points to the doc's section instead."""
    line = CollapseWatch(experts=8, top_k=2, layers=[0, 1]).message(30, 1, 0.4996, 0.0, 0.001)
    assert "1/top_k = 0.5, balanced 0.125)" in line and "0.0625" not in line and "0.076" not in line
    assert line.endswith('; docs/MOE.md, "The routing-collapse warning"')


class _Log(TrainLog):
    """A trainer as far as `_log` reads it: a tiny Qwen3-MoE's config, one process, no writer of files."""

    def __init__(self, events, continued: bool = False, fresh: list | None = None, before: dict | None = None):
        cfg = SimpleNamespace(sparse_layers=[0, 1], num_nextn_predict_layers=0, num_experts=16, num_hidden_layers=2,
                              num_experts_per_tok=4, expert_layers=[0, 1], router_aux_loss_coef=0.001)
        model = SimpleNamespace(config=cfg, moe=SimpleNamespace(bias_update_rate=0.0, aux_loss_coef=None,
                                                                 z_loss_coef=0.0))
        self.layout, self.state = SimpleNamespace(raw_model=model, strategy=None), SimpleNamespace(
            interval_loss=8.0, interval_steps=2, loss_sum=0.0, global_step=0, tokens_seen=0, consumed_samples=0,
            last_batch_hash="", log_history=[], routers_from_init=fresh or [], routers_steps_before=before or {})
        self.comm = SimpleNamespace(mean=lambda x: x)
        self.schedule = SimpleNamespace(lr_at=lambda step: 1e-3, phase=lambda step: None, warmup_steps=10)
        self.throughput = SimpleNamespace(time_remaining=lambda n: 0.0, interval=dict)
        self.loop, self.device, self.writer = SimpleNamespace(memory_metrics=False, max_steps=100), "cpu", None
        self.resumed_step = 0  # (a process from step 0)
        self.events, self.continued = events, continued

    def record_event(self, kind, values, step=None):
        self.events.append((kind, self.state.global_step, values))


def test_train_log_warns_and_records_a_collapse(monkeypatch, caplog):
    """Warm-up 10, a router from init: the intervals ending at steps 80 and 100 are in its grace (100 steps), those
    from 100 on judged; continuing a trained MoE (continue_training), the same shares are judged from the start."""
    for continued, steps, at in ((False, (80, 100, 120, 140), 140), (True, (20, 40, 60, 80), 40)):
        shares = iter([[0.1, 0.24], [0.1, 0.2499], [0.1, 0.25], [0.1, 0.25]])
        monkeypatch.setattr(moe_loss, "log_values",
                            lambda model, strategy, shares=shares: {"moe_expert_share_per_layer": next(shares)})
        monkeypatch.setattr(moe_loss, "sparse_blocks", lambda model: [object()])  # router_terms: a transformers block
        events = []
        t = _Log(events, continued)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="pretrain_cli"):
            for step in steps:
                t.state.global_step = step
                t._log(grad_norm=1.0)
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warned) == 1 and warned[0].startswith(f"step {at}: model.layers.1.mlp routes nearly every token")
        assert events == [("routing_collapse", at, {"layer": 1, "max_expert_share": 0.25 if at == 140 else 0.2499,
                                                    "top_k": 4, "experts": 16, "moe_router_bias_update_rate": 0.0,
                                                    "router_aux_loss_coef": 0.001})], events


def test_a_continued_models_router_from_init_alone_gets_the_grace(monkeypatch, caplog):
    """Continuing a DeepSeek-V3 from an HF snapshot starts its MTP module (no weights saved) from init: that layer's
    router gets the grace, the trained ones none (the grace was all-or-nothing: none for a continued run)."""
    w = CollapseWatch(experts=16, top_k=4, layers=[1, 2], warmup_steps=20, decoder_layers=2, from_init=[2])
    steps = (20, 40, 60, 80, 100, 110, 120)
    assert [w.see([0.25, 0.25], s) for s in steps] == [[], [(1, 0.25)], [], [], [], [], [(2, 0.25)]]
    monkeypatch.setattr(moe_loss, "log_values", lambda model, strategy: {"moe_expert_share_per_layer": [0.25, 0.25]})
    monkeypatch.setattr(moe_loss, "sparse_blocks", lambda model: [object()])
    events = []
    t = _Log(events, continued=True, fresh=[1])  # the trainer state's routers_from_init: layer 1's
    for step in (20, 40, 60, 80):
        t.state.global_step = step
        t._log(grad_norm=1.0)
    assert [(kind, step, v["layer"]) for kind, step, v in events] == [("routing_collapse", 40, 0)], events


def test_a_resumed_states_steps_before_are_read_as_a_continued_directorys_are(monkeypatch):
    """The train log read routers_steps_before with checks of its own: a negative count (-50) pushed layer 0's grace
    to step 150 and a bool counted as a step, where the directory a run continues from has them count as none.
    One reader now (`steps_before`): both layers judged from 100, warned at 120."""
    kept = {"0": -50, "1": True, "2": 2.5, "3": 40, "x": 5, "²": 5}
    assert steps_before(kept) == {3: 40} and steps_before(None) == {} and steps_before([40]) == {}
    monkeypatch.setattr(moe_loss, "log_values", lambda model, strategy: {"moe_expert_share_per_layer": [0.25, 0.25]})
    monkeypatch.setattr(moe_loss, "sparse_blocks", lambda model: [object()])
    events = []
    t = _Log(events, continued=True, fresh=[0, 1], before={"0": -50, "1": True})
    for step in range(100, 190, 10):
        t.state.global_step = step
        t._log(grad_norm=1.0)
    assert [(step, v["layer"]) for _, step, v in events] == [(120, 0), (120, 1)], events


def test_a_run_ending_before_its_routing_is_judged_is_told_once(monkeypatch):
    """A from-init run whose max_steps ends before the grace + 20 steps was never judged, silently: one note says
    from which step routing is judged; none when the run gets there, or has no grace."""
    w = CollapseWatch(experts=16, top_k=4, layers=[0, 1], warmup_steps=20)
    assert w.note(60) == ("routing is judged for a collapse from step 100, where the grace of a router from random "
                          "init ends, and warned of 20 steps after: this run ends at step 60, so its routing is not "
                          "judged; docs/MOE.md, \"The routing-collapse warning\"")
    assert w.note(119).endswith("ends at step 119, so its routing is not judged; " + w.note(60).split("; ")[-1])
    assert w.note(120) is None and _trained().note(10) is None
    mtp = CollapseWatch(experts=16, top_k=4, layers=[1, 2], decoder_layers=2, from_init=[2])
    # one sentence: the MTP module's layer named without a parenthesis inside another (it read "(... (...))")
    assert mtp.note(50) == ("routing is judged for a collapse from step 100 in the MTP module's model.layers.2.mlp, "
                            "where the grace of a router from random init ends, and warned of 20 steps after: this "
                            "run ends at step 50, so that layer is not judged; " + w.note(60).split("; ")[-1])
    assert "(" not in mtp.note(50).split("; ")[0]
    monkeypatch.setattr(moe_loss, "log_values", lambda model, strategy: {"moe_expert_share_per_layer": [0.1, 0.1]})
    monkeypatch.setattr(moe_loss, "sparse_blocks", lambda model: [object()])
    with product_log_lines() as lines:  # (not caplog: `log_lines`)
        for continued, said in ((False, 1), (True, 0)):  # max_steps 100, grace 100: from init told; trained: judged
            t = _Log([], continued)
            del lines[:]
            for step in (10, 20, 30):
                t.state.global_step = step
                t._log(grad_norm=1.0)
            notes = [line for line in lines if line.startswith("note: routing is judged")]
            assert len(notes) == said and all("ends at step 100" in n for n in notes), notes
