"""Token dropping under `capacity_factor` said: the routing watch warns of a log interval that dropped a tenth of the
assignments or more, once, and again only at twice the share warned of (`routing_watch.CollapseWatch.dropping`),
with a `tokens_dropped` record; the exports' one note says the exported model runs every token (dropless), beside
the routing bias's (`training.export_notes`). A user's Qwen2-MoE run (capacity_factor 1.0) dropped 0.6717 at step
10 and 0.4357 at step 30 without a word."""
import contextlib
import io
import json

import pytest

from data_helpers import write_tokens

from pretrain_cli import cli
from pretrain_cli.models.config import ModelConfig
from pretrain_cli.config.presets import resolve_model_dir
from pretrain_cli.training.export_notes import note
from pretrain_cli.training.routing_watch import CollapseWatch

TRAIN = ["--model_name_or_path", "micro-qwen3-moe", "--device", "cpu", "--max_steps", "4", "--save_steps", "4",
         "--max_seq_length", "32", "--per_device_train_batch_size", "2", "--logging_steps", "1", "--do_train",
         "--split", "90,5,5", "--disable_tqdm", "true"]


def test_a_high_dropped_share_is_warned_once_and_again_only_at_twice_it():
    w = CollapseWatch(experts=16, top_k=4, layers=[0, 1, 2, 3], from_init=False)
    said = []
    for step, share in ((1, 0.0757), (10, 0.6717), (30, 0.4357), (40, 0.9)):  # the user's 10 and 30; 0.9 < 2 x 0.6717
        w.see([0.1] * 4, step)
        said.append(w.dropping(share))
    assert said == [False, True, False, False]  # 0.0757: capacity_factor 1's rounding at init, under 0.1
    w = CollapseWatch(experts=16, top_k=4, from_init=False)
    assert [w.dropping(x) for x in (0.12, 0.2, 0.1, 0.24, 0.47, 0.48)] == [True, False, False, True, False, True]


def test_the_warning_names_the_interval_the_worst_layer_the_capacity_and_the_export():
    w = CollapseWatch(experts=16, top_k=4, layers=[0, 1, 2, 3], from_init=True, warmup_steps=20)
    w.see([0.1] * 4, 20)
    w.see([0.2] * 4, 30)  # (in the collapse's grace: drops are judged all the same)
    assert w.dropping(0.4357)
    line = w.drop_message(30, 0.4357, [0.3, 0.5, 0.6, 0.3428], 1.0, 512)
    assert line == ("step 30: 43.6% of the routed expert assignments were dropped over steps 21-30 (moe_dropped_share "
                    "0.4357; the most in model.layers.2.mlp, 0.6000): capacity_factor 1 keeps at most 512 of a "
                    "micro-batch's assignments per expert, and the tokens past it skip that expert in training, where "
                    "the exported model (dropless, as transformers runs it) computes every one; raise capacity_factor, "
                    "set it to 0 (dropless) or balance the routing; said again at 0.8714 or more; docs/MOE.md, \"Token "
                    "dropping\""), line
    assert "said again" not in w.drop_message(30, 0.6, [0.6], 1.0, 512)  # 2 x 0.6 > 1: never again


def test_the_interval_said_begins_after_the_line_before_and_after_a_resume():
    """Step 1 has its own line, so the next one's interval is steps 2-10 (it said 1-10); a process resumed from
    checkpoint-25 counts from step 26 (its first line at 30 said "over step 30")."""
    spans = []
    for resumed_at, steps in ((0, (1, 10, 20)), (25, (30, 40))):
        w = CollapseWatch(experts=16, top_k=4, from_init=False, resumed_at=resumed_at)
        for step in steps:
            w.see([0.1] * 4, step)
            spans.append((w.first, w.drop_message(step, 0.5, [0.5], 1.0, 512).split(" (", 1)[0].split("over ")[1]))
    assert spans == [(1, "step 1"), (2, "steps 2-10"), (11, "steps 11-20"), (26, "steps 26-30"),
                     (31, "steps 31-40")], spans


def test_the_export_note_says_dropless_beside_the_routing_bias():
    cfg = ModelConfig.from_file(str(resolve_model_dir("micro-qwen3-moe")))
    assert note(cfg, [], 0.0) is None and note(cfg, [], None) is None and note(cfg, [[0.0, 0.0]], 0) is None
    both = note(cfg, [[0.03, -0.03]], 1.25)
    assert both.startswith("note: the routing bias the run trained (moe_router_bias_update_rate; largest |bias| "
                           "0.03) is not exported"), both
    assert ("; and the run trained with capacity_factor 1.25, which drops the assignments past an expert's capacity "
            "(the log's moe_dropped_share says how many); the exported model runs every token (dropless), as "
            "transformers' Qwen3MoeForCausalLM does") in both, both
    assert both.endswith('; docs/MOE.md, "Evaluate, generate, export"') and both.count("note:") == 1
    dense = ModelConfig.from_file(str(resolve_model_dir("micro-llama")))  # the key has no effect on a dense model
    assert note(dense, [], 1.25) is None


@pytest.fixture(scope="module")
def dropped(tmp_path_factory):
    """(output_dir, the run's log lines): micro-qwen3-moe, 4 steps logged each, capacity_factor 0.5 (< 1: drops
    at balance too)."""
    root = tmp_path_factory.mktemp("dropped")
    out = root / "run"
    stdout = io.StringIO()  # (train's log handler writes to the sys.stdout of the moment: `metrics._Stdout`)
    with contextlib.redirect_stdout(stdout):
        assert cli.main(["train", *TRAIN, "--input_dir", write_tokens(root / "c", vocab_size=512),
                         "--capacity_factor", "0.5", "--output_dir", str(out)]) == 0
    return out, [line.split("] - ", 1)[-1] for line in stdout.getvalue().splitlines()]


def test_a_run_dropping_tokens_says_so_at_start_in_its_log_and_at_its_export(dropped):
    out, lines = dropped
    experts = next(x for x in lines if "experts: 8 routed" in x)  # 2 x 32 tokens x top-2 = 128; 16 at balance
    assert ("capacity_factor 0.5: an expert computes at most 8 of a micro-batch's 128 assignments (64 tokens x "
            "top-2; 16 each at balance), the rest dropped") in experts, experts
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    shares = [r["moe_dropped_share"] for r in records if r["kind"] == "train"]
    events = [r for r in records if r["kind"] == "tokens_dropped"]
    warned = [x for x in lines if "of the routed expert assignments were dropped" in x]
    # what the watch decides of the shares the run logged: one warning each, at its step, with its record
    replay, steps = CollapseWatch(experts=8, top_k=2, from_init=False), []
    for r in (r for r in records if r["kind"] == "train"):
        replay.see(r["moe_expert_share_per_layer"], r["step"])
        steps += [r["step"]] if replay.dropping(r["moe_dropped_share"]) else []
    assert shares[0] >= 0.5 and steps[0] == 1 and len(warned) == len(events) == len(steps), (shares, warned)
    assert [e["step"] for e in events] == steps and all(w.startswith(f"step {s}: ") for w, s in zip(warned, steps))
    assert events[0]["capacity_factor"] == 0.5 and events[0]["expert_capacity"] == 8
    assert events[0]["dropped_share"] == round(shares[0], 4) and len(events[0]["dropped_share_per_layer"]) == 2
    assert events[0]["since_step"] == 1  # (logged every step: each line's interval is its step)
    final = [x for x in lines if x.startswith("note: the run trained with capacity_factor 0.5")]
    assert len(final) == 1 and "the exported model runs every token (dropless)" in final[0], final


def test_export_of_a_checkpoint_says_dropless_from_its_args_json(dropped, tmp_path, capsys):
    out, _ = dropped
    assert cli.main(["export", str(out / "checkpoint-4"), str(tmp_path / "hf")]) == 0
    err = capsys.readouterr().err
    assert "note: the run trained with capacity_factor 0.5, which drops the assignments past" in err, err


def test_a_resumed_run_names_the_steps_since_its_checkpoint(tmp_path):
    """Resumed from checkpoint-2 with a line every 2 steps, the resumed process's first line (step 4) covers steps
    3-4, where the model's counts began (it said "over step 4"; R6's, from checkpoint-25: "over step 30"): also with
    gradient accumulation, and a global batch the resumed run changed (4 sequences a step, then 2)."""
    data, out, lines, said = write_tokens(tmp_path / "c", vocab_size=512), tmp_path / "run", [], []
    for steps, micro in (("2", "2"), ("4", "1")):  # the second resumes checkpoint-2 (a re-run of train does)
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            assert cli.main(["train", *TRAIN, "--max_steps", steps, "--save_steps", "2", "--logging_steps", "2",
                             "--per_device_train_batch_size", micro, "--gradient_accumulation_steps", "2",
                             "--input_dir", data, "--capacity_factor", "0.5", "--output_dir", str(out)]) == 0
        said += [x for x in stdout.getvalue().splitlines() if "batch: " in x]
        lines.append([x for x in stdout.getvalue().splitlines() if "assignments were dropped" in x])
    assert any("this run takes 2 from here on" in x for x in said), said  # (checkpoint-2's run: 4 a step)
    events = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    events = [(e["step"], e["since_step"]) for e in events if e["kind"] == "tokens_dropped"]
    # (step 1 logs a line of its own: the first run warns there; 0.5 at step 2 is not twice it)
    assert "were dropped over step 1 (" in lines[0][0] and "were dropped over steps 3-4 (" in lines[1][0], lines
    assert events == [(1, 1), (4, 3)], events


def test_a_rollback_before_the_first_line_leaves_the_resumed_step_where_counts_began(monkeypatch, caplog):
    """Resumed from checkpoint-4, a process trains steps 5-6, rolls back to checkpoint-4 (the spike policy's reload:
    `load_state_dict` of its state) and trains 5-8 to its first line: the counts that line reads began after step
    4, the step the trainer resumed at. Derived from the throughput's tokens since launch (6 steps), it said "over
    steps 3-8", before the checkpoint it resumed."""
    import logging

    from run_helpers import resolve_run
    from pretrain_cli import runtime
    from pretrain_cli.distributed.comms.comm import NoComm
    from pretrain_cli.models import build_model, moe_loss
    from pretrain_cli.run_config import MoeConfig
    from pretrain_cli.training.metrics import Throughput
    from pretrain_cli.training.run import lay_out
    from pretrain_cli.training.trainer import Trainer
    from pretrain_cli.training.trainer_state import Collaborators

    paddle = runtime.import_paddle()
    run = resolve_run("--max_steps", "20", "--gradient_accumulation_steps", "2", model="micro-qwen3-moe")
    cfg = ModelConfig.from_file(str(resolve_model_dir("micro-qwen3-moe")))
    with paddle.LazyGuard():
        layout = lay_out(run, build_model(cfg, None, MoeConfig()), NoComm())
    first = Trainer(layout, None, run, NoComm())
    first.state.global_step, first.state.consumed_samples = 4, 4 * first.global_batch
    saved = json.loads(json.dumps(first.state_dict()))  # checkpoint-4's trainer state
    t = Trainer(layout, None, run, NoComm(), Collaborators(throughput=Throughput.for_run(run, cfg, None)),
                resumed=saved)
    for _ in range(2):
        t._account(1.0)  # steps 5, 6
    t.load_state_dict(saved)  # the rollback to checkpoint-4
    for _ in range(4):
        t._account(1.0)  # steps 5-8
    assert (t.resumed_step, t.state.global_step, t.throughput.tokens_this_launch) == (4, 8, 6 * run.tokens_per_step)
    monkeypatch.setattr(moe_loss, "log_values", lambda model, strategy: {
        "moe_expert_share_per_layer": [0.1, 0.1], "moe_dropped_share": 0.5, "moe_dropped_share_per_layer": [0.5, 0.5]})
    with caplog.at_level(logging.WARNING, logger="pretrain_cli"):
        t._log(grad_norm=1.0)
    warned = [r.getMessage() for r in caplog.records if "assignments were dropped" in r.getMessage()]
    assert len(warned) == 1 and "were dropped over steps 5-8 (" in warned[0], warned


def test_eval_of_a_run_with_a_capacity_says_it_runs_dropless(dropped, capsys):
    """`eval` computes every assignment (as transformers and, now, the run's own evaluation do): a run trained with
    a capacity is said so in one note, its loss not being the training computation's."""
    out, _ = dropped
    assert cli.main(["eval", "--model", str(out / "checkpoint-4"), "--max_batches", "1"]) == 0
    notes = [x for x in capsys.readouterr().err.splitlines() if "capacity_factor" in x]
    assert notes == [f"note: {out / 'checkpoint-4' / 'args.json'}: its run trained with capacity_factor 0.5 (the "
                     f"assignments past an expert's capacity dropped); eval runs every token (dropless), as the run's "
                     f"own evaluation and transformers do"], notes
