"""`train` after `orchestration.prepare`: the build order, then the loop, then the final output directory.

`run()` reads as the order things are built in. It alone opens the prepared run (`orchestration.run_spec.RunSpec`);
each step is a function handed the parts it uses (the resolved `RunConfig`, the model config, the run's
record for args.json), never the user's arguments.
"""
from __future__ import annotations

import sys
from pathlib import Path

from pretrain_cli import run_dir, runtime
from pretrain_cli.counts import count
from pretrain_cli.distributed.launcher import watchdog
from pretrain_cli.distributed.comms.comm import build_comm, rank0_round
from pretrain_cli.distributed.setup import build_strategy, follow_micro_batching, init_process_group
from pretrain_cli.errors import UserError, is_out_of_memory
from pretrain_cli.models.convert import as_trained
from pretrain_cli.training import checkpoint, closing, metrics, rank_exit, resume_checks, run_lock, same_run, startup
from pretrain_cli.training.run_end import FINAL_KINDS, exported, finish, nothing_to_train
from pretrain_cli.training.metrics import log
from pretrain_cli.training.optim import build_optimizer
from pretrain_cli.training.precision import build_amp
from pretrain_cli.training.step import Layout
from pretrain_cli.training.stop_signals import StopSignals
from pretrain_cli.training.trainer import Trainer
from pretrain_cli.training.trainer_state import Collaborators
from pretrain_cli.training.weight_source import DamagedCheckpoint, WeightSource, verify_everywhere
from pretrain_cli.run_config import RunConfig
from pretrain_cli.storage.checkpoint_dir import CheckpointDir


def run(spec) -> int:
    """Build everything, train, evaluate, predict, save, holding `output_dir`'s run lock (global rank 0 takes it:
    a second run in the same directory is refused before it writes anything). Returns the process exit code."""
    from pretrain_cli.planning.hardware import training_memory_problem

    problem = training_memory_problem(spec.run, spec.model_cfg)  # before anything is written
    if problem:
        raise UserError(problem)
    told: list[str] = []  # a lock a killed run left: where it ended (`run_lock.unfinished`), context for what follows
    lock = (run_lock.acquire(spec.run.output.output_dir, spec.run.parallel.world_size, told.append)
            if spec.run.parallel.is_rank0 else None)
    signals = StopSignals()  # a run stopped by one ignores further signals until its lock is released
    try:
        return _run(spec, signals, told)
    except BaseException as e:  # stopped before `_run` logged `told`: an error is the news, `told` its context
        if told and (isinstance(e, UserError) or is_out_of_memory(e)):  # one line; `in_context` for one written anew
            e.told = f"for context, {'; '.join(line.removeprefix('note: ') for line in told)}"
            if isinstance(e, UserError):
                e.args = (in_context(str(e), e),)
        elif told:  # a crash's traceback, Ctrl-C: the lines as they were
            print("\n".join(told), file=sys.stderr, flush=True)
        raise
    finally:
        if lock is not None:
            lock.release()
        signals.restore()


def in_context(line: str, e: BaseException) -> str:
    """`line` followed by the note `run` attached to `e` (how a killed run before it ended), if any: for the
    one line that reports `e`, which `commands.train` writes anew for an out-of-memory error."""
    told = getattr(e, "told", None)
    return f"{line} — {told}" if told else line


def _log_told(told: list[str]) -> None:
    """How the run before ended (`run`'s `told`), as notes of a run that got going: no error will carry it now."""
    for line in told:
        log.info(line)
    told.clear()


def args_record(spec) -> dict | None:
    """What args.json holds (`RunSpec.record`), on global rank 0, which alone writes it (output_dir, each
    checkpoint, the final directory); None elsewhere. The record's tokenizer takes its ids fingerprint, which for
    data whose sidecars do not record it parses the whole tokenizer (~2.7 s for a Qwen-size one at load 4.5):
    computed by every rank of a node, it cost each of them that, for a record none of them writes."""
    return spec.record() if spec.run.parallel.is_rank0 else None


def _run(spec, signals: StopSignals, told: list[str]) -> int:
    paddle = runtime.import_paddle()
    r, model_cfg = spec.run, spec.model_cfg
    metrics.setup_logging(r.parallel.rank)
    paddle.set_device(r.device)
    with runtime.without_flags_banner():
        init_process_group(r.parallel, r.loop.seed, r.loop, r.device)
    comm = build_comm(r.parallel)
    same_run.check(comm, spec.fingerprint(), r.output.output_dir)  # every node the same run, one output_dir
    spec = same_run.resume(comm, spec)  # rank 0's checkpoint on every rank, and what the run keeps from it
    r, record = spec.run, args_record(spec)
    watchdog.start(r.parallel, hang_timeout=r.loop.hang_timeout, output_dir=str(r.output.output_dir),
                   overwrite=r.output.overwrite, resume_from=r.output.resume_from)
    if r.parallel.is_rank0:  # its watcher frees the lock should another rank's error end this one without `finally`
        watchdog.holding(Path(r.output.output_dir) / run_lock.LOCK_FILE)
    for line in spec.describe():
        log.info(line)
    log.info(runtime.threads_line())
    model = build_model(r, model_cfg)
    log.info(f"kernels: {model.kernels.describe()}")
    resume = _opened(spec.resume)
    done = resume.state["global_step"] if resume is not None and r.loop.do_train else None
    finished = (done is not None and done >= r.loop.max_steps and r.parallel.is_rank0
                and exported(r.output.output_dir, done))
    if comm.any(finished):  # nothing to train, evaluate or write again (an interrupted export is redone below)
        _log_told(told)
        log.info(nothing_to_train(done, r.loop.max_steps))
        if r.parallel.is_rank0:  # the run's closing blocks as its export recorded them, and where its model is
            closing.log_blocks(closing.recorded(r.output.output_dir))
            log.info(closing.already_complete(r.output.output_dir, done))
        rank_exit.leave(comm, rank_exit.End.AGREED)  # (`comm.any`: every rank is here)
        return 0
    pretrained = spec.model_dir if r.model.continue_training else None
    while True:  # a bad checkpoint fails here, before output_dir is touched
        state = resume_state(r, model_cfg, resume)
        try:
            layout = lay_out(r, model, comm, resume, pretrained)
            break
        except DamagedCheckpoint as e:
            older = previous_checkpoint(r.output, resume.path, e)
            notes = set(r.notes)
            spec = spec.resuming(older)  # what the run keeps from a checkpoint, decided again for this one
            r, record, resume = spec.run, args_record(spec), _opened(older)
            for note in (n for n in r.notes if n not in notes):
                log.info(f"note: {note}")
            model = build_model(r, model_cfg)
    started = startup.measure(r.parallel.rank, r.device)  # layout in place, no step taken
    finishing = state is not None and r.loop.do_train and state["global_step"] >= r.loop.max_steps
    if finishing:  # stopped earlier, never exported: this run only finishes it (the checkpoint it did resume)
        done = state["global_step"]  # (said below, after the line that says it resumed)
        # its evaluations at the last step are recomputed below: not recorded a second time
        state["log_history"] = [e for e in state.get("log_history", [])
                                if not (e.get("kind") in FINAL_KINDS and e.get("step") == state["global_step"])]
    written = as_trained(model_cfg, r.moe.mtp_loss_weight)  # the config.json its checkpoints and model carry
    writer = open_output_dir(r, record, state, comm, FINAL_KINDS if finishing else (),
                             (spec.model_dir, spec.tokenizer_dir))
    _log_told(told)  # past every check (the checkpoint read, the layout in place, output_dir open)
    if r.loop.do_train:  # (an evaluation-only run has no first step and leaves the training run's record alone)
        startup.report(comm, writer, started, state["global_step"] if state is not None else 0)
    collaborators = Collaborators(
        writer=writer, throughput=build_throughput(r, model_cfg),
        saver=checkpoint.Saver(r.output.output_dir, written, comm, record, spec.tokenizer_dir,
                               r.precision.param_dtype, r.loop.save_total_limit, r.loop.async_save,
                               r.parallel.rank, r.parallel.world_size, layout.strategy.name),
        rebuild=(lambda path: rebuild(r, model_cfg, comm, path)) if r.spike.rollback_rebuilds else None)
    trainer = Trainer(layout, spec.splits, r, comm, collaborators, resumed=state, signals=signals, resumed_from=resume)
    if state is not None:
        log.info(f"resumed from {resume} at step {trainer.state.global_step}, "
                 f"{count(trainer.state.consumed_samples, 'sample')} consumed")
        for line in resume_checks.data_changes(resume, r):
            log.warning(line)
    if finishing:
        log.info(f"{nothing_to_train(done, r.loop.max_steps)}; evaluating and writing the final model of step {done}")
    results = finish(r, trainer, comm, collaborators)
    if results is None:  # stopped by a signal, or not rank 0: nothing more to write here
        return 0
    from pretrain_cli.training import export

    with rank0_round(comm):
        export.write_final(r, written, trainer.raw_model, spec.tokenizer_dir, record, trainer.state_dict(),
                           results)
    # the log's last lines (rank 0's: others returned above), the model on disk
    closing.log_blocks(results)
    if r.loop.do_train:
        log.info(closing.finished(r.output.output_dir, trainer.state.global_step, r.output.export_dtype))
    comm.wait_until_seen()
    return 0


def previous_checkpoint(out, damaged: Path, e: DamagedCheckpoint) -> Path:
    """Where to resume when the files of `damaged` were found altered while reading it: the next older intact
    checkpoint in `out` (the run's `Output`; every rank lists and size-checks the same shared directory, so all
    choose the same); none left, or a checkpoint the file named (`resume_from_checkpoint`): one line, exit 2."""
    from pretrain_cli.run_dir import list_checkpoints
    from pretrain_cli.storage import intact

    if out.resume_from:
        raise UserError(f"resume_from_checkpoint: {damaged}: {e}; resume from another checkpoint")
    log.warning(intact.skipping(damaged, str(e)))
    step = next(n for n, p in list_checkpoints(out.output_dir) if p.name == damaged.name)
    return intact.previous(out.output_dir, step, str(e), checksums=False)


def _opened(path) -> CheckpointDir | None:
    """The checkpoint to resume from as the one object every step of the resume asks (its files read once)."""
    return CheckpointDir(path) if path is not None else None


def rebuild(run: RunConfig, model_cfg, comm, path) -> Layout:
    """A rollback on a layout of placed pieces (`EngineTraits.placed_pieces`), which whole tensors cannot be
    written into mid-run (ZeRO-2's optimizer updates its own shards, ZeRO-3's and TP's parameters are pieces; a
    pipeline rank keeps only its stage's tensors, an expert-parallel rank only its experts). So the model and its layout
    are built again from the checkpoint, in the order and with the seed of a restart that resumes from it (the trainer
    has released the old ones first)."""
    log.info(f"rebuilding the model and its layout from {Path(path).name} (the layout's placed pieces "
             f"cannot be written into mid-run)")
    model = build_model(run, model_cfg)
    path = CheckpointDir.of(path)
    resume_state(run, model_cfg, path)
    return lay_out(run, model, comm, path)


def lay_out(run: RunConfig, model, comm, resume=None, pretrained=None) -> Layout:
    """Recompute, the parameters' layout over the processes, optimizer, precision, compilation, then the
    model and optimizer wrapped for the layout, in that order (the benchmark harness steps exactly this, as
    `Trainer(lay_out(...), ...)`). A lazily built model's parameters are created by the layout, each rank only
    its own blocks (`distributed.layout.materialize`): read from the `resume` checkpoint (a `CheckpointDir`) or the
    `pretrained` directory (`training.weight_source`: the one way weights get in), else initialised. Resuming,
    each rank then checks the checksums of the files it read (`DamagedCheckpoint` on every rank when any rank
    found one altered). Weights are read only into a lazily built model (`build_model`); an eagerly built one
    (the benchmark harness, tests) starts from its own values."""
    from pretrain_cli.distributed.layout.materialize import after_o2, pending
    from pretrain_cli.ops.kernels import select_step

    read, initialised, routers_before = None, frozenset(), {}
    weights = resume if resume is not None else pretrained
    if weights is not None and not any(pending(p) for p in model.parameters()):
        raise RuntimeError("lay_out reads weights into a lazily built model only (training.run.build_model)")
    source = open_weights(run, model, resume, pretrained)
    try:
        step_kernels = select_step(run.kernels, run.device)  # the fused multi-tensor AdamW where config chose it
        follow_micro_batching(run.parallel, run.loop)  # (a resume decided after the join can change it)
        strategy = build_strategy(run.parallel, run.device, step_kernels, run.recompute)
        raw_model = model  # what checkpoints read: the whole model (a pipeline's stages are built over its sublayers)
        model = strategy.place(model, source)  # this rank's parameters created: before the optimizer exists
        optimizer = build_optimizer(model, run.optimizer, run.schedule, multi_precision=run.precision.master_weights,
                                    adamw=step_kernels.adamw)
        model, optimizer, amp = build_amp(model, optimizer, run.precision)
        if run.precision.master_weights:  # O2 cast what exists; what is created later (ZeRO-3) is created cast
            after_o2(source, raw_model, run.precision.amp_dtype)  # (but the routers O2 leaves fp32)
        if run.kernels.to_static:
            from pretrain_cli.ops.compiled_forward import CompiledBackward, compile_forward

            model, amp = compile_forward(model), CompiledBackward(amp)  # (same model object: checkpoints unaffected)
        model, optimizer = strategy.wrap(model, optimizer)  # (ZeRO-3 creates its shards here)
        amp.wrap_scaler(strategy)  # its scaler wrapper and its way to unscale
        if resume is not None:  # after AMP and sharding: O2 master weights and ZeRO-1 shards exist now
            opt = checkpoint.load_optimizer(strategy, raw_model, optimizer, resume)
            read = source.bytes_read + opt["bytes_read"]  # each rank read only the blocks it holds
            verify_everywhere(comm, resume, source.files + opt["files"])
    finally:
        if isinstance(source, WeightSource):
            initialised, routers_before = source.initialised, source.routers_before
            source.close()
    return Layout(model, optimizer, amp, strategy, raw_model, resume_bytes_read=read, initialised=initialised,
                  routers_before=routers_before)


def open_weights(run: RunConfig, model, resume=None, pretrained=None):
    """Where `model`'s parameters come from: a `WeightSource` over the `resume` checkpoint or the `pretrained`
    directory (its names, shapes and dtypes checked against the model's now, before any tensor is read), else
    the initial values. `lay_out` places from it and `check` opens it (`check_pretrained`), so both read a
    model directory by the same name map."""
    from pretrain_cli.distributed.layout.materialize import InitSource

    init = InitSource(model.config, run.loop.seed, runtime.threads())
    weights = resume if resume is not None else pretrained
    if weights is None:
        return init
    # a pretrained directory without multi-token prediction modules (transformers saves none) starts them from init
    if resume is not None:
        return WeightSource(weights, model, "checkpoint", use="resume")
    return WeightSource(weights, model, "model directory", init, use="continue_training")


def check_pretrained(run: RunConfig, model_cfg, model_dir) -> None:
    """`check`'s reading of `continue_training`'s `model_dir`: opened as `lay_out` opens it (`open_weights`) over
    the model `build_model` builds, there with reference kernels. A mismatch is the `UserError` train would stop
    with."""
    open_weights(run, build_model(run, model_cfg, reference=True), pretrained=model_dir).close()


def build_model(run: RunConfig, model_cfg, reference: bool = False):
    """The single-device model with the kernels the run asked for, built lazily (`paddle.LazyGuard`: names,
    shapes and dtypes, no storage): `lay_out` creates on each rank only what it holds (initialised, or read
    from a checkpoint or `continue_training`'s pretrained weights). `reference`: Paddle's ops and no layout
    entries instead, for a model that never runs (`check_pretrained`): its names and shapes are the same, and the
    run's kernels would compile the fused CPU ones and the layout's want its process groups."""
    import paddle

    from pretrain_cli.distributed.comms.collectives import for_device
    from pretrain_cli.distributed.steps.order import build_kernels
    from pretrain_cli.models import build_model as build_causal_lm
    from pretrain_cli.ops import kernels

    paddle.seed(run.loop.seed)
    # the layout's kernels (context parallelism's ring, the semi-auto engine's local pieces, a MoE block's dispatch
    # and expert counts): chosen before the model exists, so no live layer is changed
    table = (kernels.Kernels() if reference
             else build_kernels(kernels.select(run.kernels, run.device), run.parallel, for_device(run.device)))
    with paddle.LazyGuard():
        return build_causal_lm(model_cfg, table, run.moe)


def resume_state(run: RunConfig, model_cfg, resume: CheckpointDir | None) -> dict | None:
    """The checkpoint's trainer state, after checking it fits the model (None when starting fresh). Its weights
    are read by `lay_out`, each rank only its blocks."""
    if resume is None:
        return None
    resume_checks.check_compatible(resume, model_cfg, run.data.max_seq_length, bool(run.output.resume_from))
    return resume.state


def open_output_dir(r: RunConfig, record: dict, state: dict | None, comm, redo: tuple = (), reads: tuple = ()):
    """Rank 0 only, and only now that a resume checkpoint has fully loaded (a bad one leaves output_dir
    untouched): the directory, args.json (`record`), and the metrics writer (None on other ranks). Starting over
    (`overwrite_output_dir`) in a run's directory, the earlier final export goes too, unless the run reads its model
    or tokenizer from there (`reads`: the directories it does). The other ranks
    wait for it on the launcher's store (`comm.wait_for_rank0`), not in the collective that follows: gloo ends a
    collective after 30 s, and a tracker that gets the run's history anew (one without its checkpoint's mark,
    `training.record_files`; a new wandb run, up to `trackers_wandb.REPLAY_BYTES`) takes longer on a long run."""
    if not r.parallel.is_rank0:
        comm.wait_for_rank0("opening output_dir (metrics.jsonl and the trackers of report_to)")
        return None
    from pretrain_cli import atomic

    with rank0_round(comm):
        out = Path(r.output.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        checkpoint.clean_leftovers(out)
        keep_until = state["global_step"] if state is not None else (None if r.loop.do_train else float("inf"))
        # the trackers start first: one that fails (wandb not logged in) leaves the directory's records as they were;
        # a resume cuts their files back to where its checkpoint's mark says they stood (`record_files`)
        writer = metrics.MetricsWriter(str(out), r.output.logging_dir, r.output.report_to, keep_until, record, redo,
                                       state.get("record_files") if state is not None else None)
        if r.loop.do_train and r.output.overwrite:
            start = state["global_step"] if state is not None else 0
            removed = checkpoint.remove_past(out, start)
            if removed:
                log.info(f"overwrite_output_dir: removed {', '.join(p.name for p in removed)} (an earlier run's, "
                         f"past step {start}, where this run starts)")
            if (out / run_dir.ARGS_FILE).is_file() and not any(d and Path(d).resolve() == out.resolve() for d in reads):
                from pretrain_cli.training.final_model import remove_final

                if line := remove_final(out):
                    log.info(line)
        if r.loop.do_train:  # an eval-only run must not overwrite the training run's record
            from pretrain_cli.training.final_model import BEFORE_RUN, weights_before_the_run

            if before := weights_before_the_run(out):  # a download's weights: no model of this run's (`final_step`)
                record[BEFORE_RUN] = before
            atomic.write_json(out / run_dir.ARGS_FILE, record)
            # the final export's mark (`exported`) is this run's to write: an earlier run's at the same step would
            # make a re-run after a kill during this one's export find "nothing to train" and keep the old model
            (out / "all_results.json").unlink(missing_ok=True)
    return writer


def build_throughput(r: RunConfig, model_cfg) -> metrics.Throughput:
    peak, source = (metrics.resolve_peak(r.device, r.precision.amp_dtype, r.loop.peak_tflops)
                    if r.loop.do_train else (None, ""))
    tp = metrics.Throughput.for_run(r, model_cfg, peak)
    if r.loop.do_train:
        log.info(f"flops: {tp.flops:.4g} model FLOPs/token (6N + 12·L·H·d·S), mfu against {source}" if peak
                 else f"flops: mfu unknown ({source})")
    return tp
