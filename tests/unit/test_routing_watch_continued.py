"""A continue_training run from one of our own directories whose routers were still in their grace: a run from init
stopped at step 40 left them fresh, and its record (args.json, trainer_state.json) says so; the continued run gives
them the rest of the grace (max(2 x warm-up, 100) less the 40 steps they trained) instead of judging them at once as
trained weights. A directory no run of ours wrote (an HF snapshot, or one our `export` wrote: no trainer state) holds
trained routers. The trainer state says which routers it had from init itself: args.json beside it can be a later
run's."""
import json

from log_lines import product_log_lines
from run_helpers import resolve_run

from pretrain_cli import runtime
from pretrain_cli.training.routing_watch import CollapseWatch, routers_before

paddle = runtime.import_paddle()

from pretrain_cli.distributed.comms.comm import NoComm  # noqa: E402
from pretrain_cli.models import build_model, convert  # noqa: E402
from pretrain_cli.models.config import ModelConfig  # noqa: E402
from pretrain_cli.run_config import MoeConfig  # noqa: E402
from pretrain_cli.training.run import lay_out  # noqa: E402
from pretrain_cli.training.trainer import Trainer  # noqa: E402


def test_the_routers_a_directorys_run_had_from_init_with_their_steps():
    """The routers a state names (`routers_named`: a run from init names all), each with the steps it trained before
    that run too, whatever args.json beside it says (a later run's, rewritten at its start: here a run from init's
    beside a continued run's state that had none from init, which read as all 40 steps from init); an older state
    by args.json as before: a run from init had every router from init, a continued one those its state names, and
    without an args.json none; a directory without a trainer state of ours has none."""
    for args_continued in (True, False, None):
        assert routers_before({"global_step": 40, "routers_from_init": [0, 1], "routers_named": True},
                              args_continued, [0, 1]) == {0: 40, 1: 40}
        assert routers_before({"global_step": 40, "routers_from_init": [], "routers_named": True},
                              args_continued, [0, 1]) == {}
    assert routers_before({"global_step": 40, "routers_from_init": []}, False, [0, 1]) == {0: 40, 1: 40}
    chained = {"global_step": 30, "routers_from_init": [1, 3], "routers_steps_before": {"1": 40}}
    assert routers_before(chained, True, [1, 2, 3]) == {1: 70, 3: 30}
    assert routers_before({"global_step": 30}, True, [1, 2]) == {}  # a state from before the key: none named
    assert routers_before({"global_step": 40, "routers_from_init": []}, None, [0, 1]) == {}
    assert routers_before(None, False, [0, 1]) == {}


def test_a_router_that_trained_part_of_its_grace_gets_the_rest():
    """Warm-up 20: a router from init is judged from step 100; one that trained 40 steps in the run continued from,
    from step 60; one past its grace there, at once. The note names where each starts, in one sentence."""
    w = CollapseWatch(experts=8, top_k=2, layers=[0, 1], warmup_steps=20, from_init=[0, 1], before={0: 40, 1: 150})
    assert (w.start(0), w.start(1)) == (60, 0)
    assert [w.see([0.5, 0.1], s) for s in (40, 60, 70, 80)] == [[], [], [], [(0, 0.5)]]  # judged from 60 to 80
    note = CollapseWatch(experts=8, top_k=2, layers=[0, 1], warmup_steps=20, from_init=[0, 1],
                         before={0: 40}).note(70)
    assert note == ("routing is judged for a collapse from step 60 in model.layers.0.mlp and from step 100 in "
                    "model.layers.1.mlp, where the grace of a router from random init ends, less the steps "
                    "model.layers.0.mlp trained before this run, and warned of 20 steps after: this run ends at step "
                    "70, so those layers are not judged; docs/MOE.md, \"The routing-collapse warning\"")
    three = CollapseWatch(experts=8, top_k=2, layers=[0, 1, 2], warmup_steps=20, from_init=[0, 1, 2],
                          before={0: 40, 1: 40}).note(70)  # names joined with "and", and the steps' groups apart
    assert three.startswith("routing is judged for a collapse from step 60 in model.layers.0.mlp and model.layers.1.mlp"
                            ", and from step 100 in model.layers.2.mlp, where the grace of a router from random init "
                            "ends, less the steps model.layers.0.mlp and model.layers.1.mlp trained before this run, "
                            "and warned of 20 steps after: "), three


def _save(tmp_path, name: str, record: bool, step: int = 40, later_run: bool = False):
    """A model directory (safetensors, config.json) as `name`; with `record`, as a run of ours from init left it at
    `step`: its args.json (the run's resolved config) and the trainer state its Trainer keeps, as the final export
    writes them; with `later_run`, the args.json a continue_training run from it rewrote at its start (it stopped
    before its first checkpoint)."""
    out = tmp_path / name
    cfg = ModelConfig.from_file(str(_preset()))
    paddle.seed(0)
    convert.save_hf(build_model(cfg, None, MoeConfig()), cfg, str(out))
    if record:
        run = resolve_run("--max_steps", str(step), model="micro-qwen3-moe")  # from init: continue_training false
        with paddle.LazyGuard():
            lazy = build_model(cfg, None, MoeConfig())
        trainer = Trainer(lay_out(run, lazy, NoComm()), None, run, NoComm())
        trainer.state.global_step, trainer.state.consumed_samples = step, step * 8
        (out / "trainer_state.json").write_text(json.dumps(trainer.state_dict()))
        if later_run:
            run = resolve_run("--continue_training", "true", model=str(out))
        (out / "args.json").write_text(json.dumps({"arguments": {}, "run": run.to_dict()}))
    return out, cfg


def _preset():
    from pretrain_cli.config.presets import resolve_model_dir

    return resolve_model_dir("micro-qwen3-moe")


def _continue(directory, cfg, max_steps: int) -> Trainer:
    """The continued run's own path: its layout reads the directory (`lay_out`), the trainer keeps what it found."""
    run = resolve_run("--max_steps", str(max_steps), "--warmup_steps", "20", "--continue_training", "true",
                      model=str(directory))
    with paddle.LazyGuard():
        lazy = build_model(cfg, None, MoeConfig())
    return Trainer(lay_out(run, lazy, NoComm(), pretrained=directory), None, run, NoComm())


def _warnings_and_notes(trainer: Trainer, steps) -> list[str]:
    """The lines the trainer's routing watch logs for both layers at 1/top_k (a collapse) at each of `steps`."""
    with product_log_lines() as lines:
        for step in steps:
            trainer.state.global_step = step
            trainer._watch_routing({"moe_expert_share_per_layer": [0.5, 0.5]})
    return [line for line in lines if "routing" in line or "routes" in line]


def test_continuing_our_run_stopped_inside_the_grace_gives_its_routers_the_rest(tmp_path):
    """The brief's case: a run from init stopped at step 40, continued (warm-up 20): judged from step 60, warned at
    80, where it was judged at once (warned at 60) as if its routers were trained; the same weights as an HF
    snapshot (no record of ours) are trained ones; a continued run that ends at 70 is told its routing is not
    judged."""
    ours, cfg = _save(tmp_path, "stopped-at-40", record=True)
    hf, _ = _save(tmp_path, "snapshot", record=False)
    continued = _continue(ours, cfg, max_steps=200)
    assert continued.state.routers_from_init == [0, 1]
    assert continued.state.routers_steps_before == {"0": 40, "1": 40}  # kept in its checkpoints' trainer state
    assert continued.state_dict()["routers_steps_before"] == {"0": 40, "1": 40}
    lines = _warnings_and_notes(continued, (40, 60, 70, 80))
    assert len(lines) == 2 and all(line.startswith("step 80: model.layers.") for line in lines), lines
    trained = _continue(hf, cfg, max_steps=200)
    assert trained.state.routers_from_init == [] and trained.state.routers_steps_before == {}
    lines = _warnings_and_notes(trained, (40, 60, 70, 80))
    assert len(lines) == 2 and all(line.startswith("step 60: model.layers.") for line in lines), lines
    short = _warnings_and_notes(_continue(ours, cfg, max_steps=70), (10,))
    assert short == ["note: routing is judged for a collapse from step 60 in model.layers.0.mlp and model.layers.1.mlp"
                     ", where the grace of a router from random init ends, less the steps they trained before this "
                     "run, and warned of 20 steps after: this run ends at step 70, so those layers are not judged; "
                     "docs/MOE.md, \"The routing-collapse warning\""], short


def test_the_state_says_which_routers_were_from_init_whatever_args_json_says(tmp_path):
    """A run continuing from its own output_dir rewrites args.json there at its start; stopped before its first
    checkpoint and run again, it read its own record (continue_training) beside the state of the run from init that
    wrote the directory, and took those routers, 40 steps into their grace, for trained ones (warned at 60). The
    state names them itself now: the rest of the grace, warned at 80."""
    ours, cfg = _save(tmp_path, "stopped-at-40", record=True, later_run=True)
    assert json.loads((ours / "args.json").read_text())["run"]["model"]["continue_training"] is True
    continued = _continue(ours, cfg, max_steps=200)
    assert continued.state.routers_from_init == [0, 1] and continued.state.routers_steps_before == {"0": 40, "1": 40}
    lines = _warnings_and_notes(continued, (40, 60, 70, 80))
    assert len(lines) == 2 and all(line.startswith("step 80: model.layers.") for line in lines), lines


def test_a_resume_of_the_continued_run_keeps_the_rest_of_the_grace(tmp_path):
    """The continued run's checkpoint state brings its routers' steps back: the resumed process judges from 60."""
    ours, cfg = _save(tmp_path, "stopped-at-40", record=True)
    first = _continue(ours, cfg, max_steps=200)
    first.state.global_step = 50
    snapshot, _ = _save(tmp_path, "snapshot", record=False)  # what the resume reads has no say: its state does
    resumed = _continue(snapshot, cfg, max_steps=200)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert resumed.state.routers_steps_before == {"0": 40, "1": 40}
    lines = _warnings_and_notes(resumed, (50, 60, 70, 80))
    assert len(lines) == 2 and all(line.startswith("step 80: model.layers.") for line in lines), lines


def test_a_resume_keeps_its_routers_named_and_an_older_state_is_named_on_resume(tmp_path):
    """A run from init names every router (`routers_named`), and a resume keeps it (state_dict -> load_state_dict).
    A state written before the key (routers_named absent) is named when resumed, so that a directory without an
    args.json reads it too: a run from init's, whose routers_from_init is [], with all its routers; a continued
    run's with its own list, which was exact."""
    run = resolve_run("--max_steps", "40", model="micro-qwen3-moe")
    cfg = ModelConfig.from_file(str(_preset()))
    with paddle.LazyGuard():
        lazy = build_model(cfg, None, MoeConfig())
    layout = lay_out(run, lazy, NoComm())
    first = Trainer(layout, None, run, NoComm())
    first.state.global_step = 40
    state = json.loads(json.dumps(first.state_dict()))
    resumed = Trainer(layout, None, run, NoComm(), resumed=state)
    assert (resumed.state.routers_named, resumed.state.routers_from_init) == (True, [0, 1])
    older = {**{k: v for k, v in state.items() if k != "routers_named"}, "routers_from_init": []}
    upgraded = Trainer(layout, None, run, NoComm(), resumed=older)
    assert (upgraded.state.routers_named, upgraded.state.routers_from_init) == (True, [0, 1])
    assert routers_before(upgraded.state_dict(), None, [0, 1]) == {0: 40, 1: 40}  # (the older one: {} without args)
    snapshot, _ = _save(tmp_path, "snapshot", record=False)
    continued = _continue(snapshot, cfg, max_steps=200)
    continued.load_state_dict({**older, "routers_from_init": [1]})
    assert (continued.state.routers_named, continued.state.routers_from_init) == (True, [1])
    assert routers_before(continued.state_dict(), None, [0, 1]) == {1: 40}  # (without args.json: {} before)


def test_an_older_states_routers_are_named_by_the_run_that_wrote_it(tmp_path):
    """A state from before routers_named was named by this run's continue_training: a continued run resuming a
    from-init run's checkpoint kept its empty list (no router from init). The checkpoint's args.json says whose it is."""
    from pretrain_cli.storage.checkpoint_dir import CheckpointDir

    cfg = ModelConfig.from_file(str(_preset()))
    snapshot, _ = _save(tmp_path, "snapshot", record=False)
    continued = _continue(snapshot, cfg, max_steps=200)
    older = {**{k: v for k, v in continued.state_dict().items() if k != "routers_named"}, "global_step": 40,
             "routers_from_init": []}
    ckpt = tmp_path / "checkpoint-40"
    ckpt.mkdir()
    (ckpt / "args.json").write_text(json.dumps({"version": 1, "arguments": {"continue_training": False}, "run": {}}))
    continued.load_state_dict(older, CheckpointDir(ckpt))
    assert (continued.state.routers_named, continued.state.routers_from_init) == (True, [0, 1])
