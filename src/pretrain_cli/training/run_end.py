"""The end of a training run: the loop and the evaluations after it (`finish`), the results the final directory
gets (`train_results`), and the lines and decisions about how a run ended: a stop by signal (`stop_message`),
a complete final export (`exported`), nothing left to train (`nothing_to_train`). `training.run` calls them
after the build; `commands.check` says `nothing_to_train` as a run would."""
from __future__ import annotations

from pathlib import Path

from pretrain_cli import run_dir
from pretrain_cli.distributed.launcher import progress, rerun
from pretrain_cli.errors import (OUT_OF_MEMORY, DeviceOutOfMemory, PeerFailed, UserError, is_out_of_memory,
                                 os_error_line)
from pretrain_cli.training import checkpoint, closing, node_loss, rank_exit
from pretrain_cli.training.metrics import log
from pretrain_cli.training.spike import SpikeError
from pretrain_cli.training.closing import progress_or_epoch
from pretrain_cli.training.trainer_state import Collaborators, NonFiniteError
from pretrain_cli.run_config import RunConfig
from pretrain_cli.storage.checkpoint_dir import CheckpointDir


# what a run records at its last step after the checkpoint (its final results): its evaluations, its closing metrics
FINAL_KINDS = ("eval", "test", closing.RECORD_KIND)


def finish(r: RunConfig, trainer, comm, collaborators: Collaborators) -> dict | None:
    """Train, evaluate, predict; returns the results rank 0 writes into the final directory (None: stopped by
    a signal, or another rank, which waits for rank 0 to write it). The collaborators `_run` built are closed
    here, once the loop and evaluation are done with them. Every end leaves through `rank_exit.leave`, which says
    how the ranks leave after each kind."""
    results, end, error = None, rank_exit.End.DONE, None
    try:
        stopped = False
        if r.loop.do_train and trainer.state.global_step < r.loop.max_steps:
            stopped = trainer.train()["stopped_by_signal"]
            progress.mark("save", trainer.state.global_step)  # the watchers allow the background write a save's time
            _wait_for_saves(collaborators.saver)  # the last checkpoint is on disk before anything else happens
        if stopped:  # agreed after the step (`comm.any`): every rank stops at it
            from pretrain_cli.distributed.launcher import job

            message = stop_message(r.output, trainer.state.global_step)
            if trainer.lost_nodes:  # stopped for a node whose launcher died: no success (`node_loss`), exit 1
                error = PeerFailed(node_loss.line(r.parallel.rank, trainer.lost_nodes, _node_ranks(r), message))
            else:
                job.record(r.parallel.rank, 0, "stopped", message)  # launch.sh: a stop, not a failure to retry
            if r.parallel.is_rank0:  # the metrics so far, then how to go on: the log's last lines
                closing.log_block(closing.closing_metrics(train_results(trainer)))
                message = closing.stopped(message, r.output.output_dir, trainer.state.global_step)
            log.warning(message)
            end = rank_exit.End.AGREED
        else:
            results = _final_results(r, trainer)
            if r.loop.do_train:  # recorded once, at the end (not at a stop); said after the export (`training.run`)
                trainer.record_closing(closing.closing_metrics(results))
    except (NonFiniteError, SpikeError) as e:  # decided on every rank at the same step: not a death
        # (a non-finite step: by the verdict `step.Step` agrees on over the ranks; a spike: by their mean loss)
        progress.mark("save", trainer.state.global_step)  # a background write in flight is given a save's time
        _wait_for_saves(collaborators.saver, quiet=True)
        end, error = rank_exit.End.AGREED, UserError(str(e))
    except UserError as e:  # its own exit code and kind (a PeerFailed, rank 0 failed: 1, retried); often one rank's
        end, error = rank_exit.End.ALONE, e
    except OUT_OF_MEMORY as e:  # the step being run; no checkpoint is half-written (atomic.py)
        if isinstance(e, OSError) and e.errno is not None and not is_out_of_memory(e):
            end, error = rank_exit.End.ALONE, e  # the system refused (disk full): its line, not a death, is the news
        elif not is_out_of_memory(e):  # (Paddle's `(External)` OSError carries no errno: gloo's, maybe)
            raise
        else:
            end, error = rank_exit.End.ALONE, DeviceOutOfMemory(trainer.state.global_step + 1)
            error.__cause__ = e
    finally:  # any other error may be gloo reporting a dead peer: the watcher stays to name it
        collaborators.close()
    rank_exit.leave(comm, end, UserError(os_error_line(error)) if isinstance(error, OSError) else error)
    if end == rank_exit.End.ALONE:  # a background write is published or given up (it may wait for a rank now gone)
        _wait_for_saves(collaborators.saver, quiet=True)
        if collaborators.saver is not None:  # (its .tmp, should rank 0 not publish it)
            collaborators.saver.abandon(error)
    if error is not None:
        raise error
    if results is not None and not r.parallel.is_rank0:
        comm.wait_for_rank0("writing the final model")
        return None
    return results


def _node_ranks(r: RunConfig) -> list[int]:
    """The ranks of this node (the launcher numbers a node's ranks in a row)."""
    from pretrain_cli.distributed.launcher import launch

    first = r.parallel.rank - launch.local_rank()
    return list(range(first, first + launch.local_size()))


def _final_results(r: RunConfig, trainer) -> dict:
    """The train keys, then the evaluations at the last step (the loop's own, if it just evaluated this step)."""
    results = train_results(trainer) if r.loop.do_train else {}
    if r.loop.do_eval:
        fresh = trainer.last_eval.get("global_step") == trainer.state.global_step
        results.update(trainer.last_eval if fresh else trainer.evaluate("valid"))
    if r.loop.do_predict:
        results.update(trainer.evaluate("test"))
    return results


def _wait_for_saves(saver: checkpoint.Saver, quiet: bool = False) -> None:
    """An asynchronous save in flight is published before the run moves on or ends (its error raised,
    unless the run is already failing for another reason)."""
    try:
        saver.wait()
    except Exception as e:
        if not quiet:
            raise
        log.warning(f"the checkpoint being written in the background failed too: {e}")


def stop_message(output, step: int) -> str:
    """`output`: the run's `Output`; where the user's own command starts again is `rerun.judge`'s (the watchers'
    advice too), on the user's settings (`rerun.as_set`): a launch.sh MAX_RESTART restart runs with its own
    `--overwrite_output_dir false` and perhaps `--resume_from_checkpoint`, which the user never set. A named checkpoint
    beside the later ones in output_dir (this stop's among them) is refused without overwrite (`rerun.REFUSED`)."""
    output_dir, overwrite, resume_from = rerun.as_set(output.output_dir, output.overwrite, output.resume_from)
    how, here = rerun.judge(overwrite, resume_from, output_dir), run_dir.checkpoint_dir(output_dir, step)
    if how == rerun.REFUSED:
        return (f"stopped at step {step} and saved checkpoint-{step}; the same command is refused "
                f"(resume_from_checkpoint names {resume_from}, and {output_dir} holds "
                f"{rerun.beyond(output_dir, resume_from)} past its step): to continue from here, set it to {here}")
    if how == rerun.NAMED:
        return (f"stopped at step {step} and saved checkpoint-{step}; the same command resumes from "
                f"{resume_from}, which resume_from_checkpoint names: to continue from here, set it to {here}")
    if how == rerun.OVER:
        return (f"stopped at step {step} and saved checkpoint-{step}; with overwrite_output_dir: true the same "
                f"command starts again from step 0: to continue, set resume_from_checkpoint to {here}")
    return f"stopped at step {step} and saved; re-run the same command to resume from checkpoint-{step}"


def exported(output_dir, step: int) -> bool:
    """Whether output_dir holds the complete final export of step `step`: its trainer_state.json, all_results.json,
    and the loss curve drawn after them (the export draws it last; a checkpoint draws it before), nothing
    half-written. A run killed while exporting has to export again."""
    from pretrain_cli import atomic

    out = Path(output_dir)
    try:
        state = CheckpointDir(out).state
        written, curve = (out / run_dir.STATE_FILE).stat(), (out / "loss_curve.png").stat()
    except (OSError, UserError):
        return False
    return (state["global_step"] == step and (out / "all_results.json").is_file()
            and curve.st_mtime_ns >= written.st_mtime_ns and not atomic.stale_temporaries(out))


def nothing_to_train(step: int, max_steps: int) -> str:
    if step == max_steps:
        return f"already at max_steps={max_steps}: nothing to train; raise max_steps to continue"
    return (f"already at step {step}, past max_steps={max_steps}: nothing to train; raise max_steps above {step} "
            f"to continue")


def train_results(trainer) -> dict:
    """train_results.json's train keys (docs/TRAINING.md, "Final output directory"): PaddleNLP's, and ours for this
    launch: `tokens_this_launch` is every rank's tokens (the global batch's) since this launch began (the keys were
    `tokens_this_process` and `effective_tokens_per_second_this_process`, which read as one process's share)."""
    s = trainer.state
    runtime_s = max(s.train_seconds, 1e-9)
    here = trainer.throughput.tokens_this_launch
    loss = (s.loss_sum + s.interval_loss) / max(s.global_step, 1)  # (the steps after the last log line: a stop)
    # every launch's samples, as train_runtime is every launch's: from tokens_seen, which ignore_data_skip does not
    # reset (consumed_samples, the data position, it does)
    samples = s.tokens_seen / trainer.seq_len
    return {"train_runtime": round(runtime_s, 4), "train_loss": loss,
            "global_step": s.global_step, "train_samples_per_second": round(samples / runtime_s, 4),
            "train_steps_per_second": round(s.global_step / runtime_s, 4),
            "progress_or_epoch": progress_or_epoch(s.global_step, trainer.loop.max_steps),  # as the log line's
            # goodput: all tokens over all restarts' training time; and this launch's alone (all its ranks)
            "train_tokens_per_second": round(s.tokens_seen / runtime_s, 4), "tokens_seen": s.tokens_seen,
            "effective_tokens_per_second_this_launch": round(here / max(trainer.process_seconds, 1e-9), 4),
            "tokens_this_launch": here, "skipped_steps": s.skipped_steps}
