"""A checkpoint directory's metadata, each file read once: `trainer_state.json`, `args.json`, `checkpoint.index.json`.

Resuming reads a checkpoint's state (its step: what makes it a checkpoint), the run that wrote it (args.json: the
sequence length and batch it trained with, its schedule) and its index (where every piece lies) in several
places: `orchestration.prepare` (compatibility, the schedule), `orchestration.resumed` (the global batch),
`training.run` (the step, the weights and the optimizer state), `storage.intact` (whether it is whole). Each
takes one `CheckpointDir` and asks it; each file is read the first time it is asked for, and only then.
`eval` and `generate` ask a model directory the same object whether a run of ours wrote it (`record`).
"""
from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path

from pretrain_cli.errors import UserError
from pretrain_cli.run_dir import ARGS_FILE, STATE_FILE, is_record


def read_state(ckpt, resume: bool = True) -> dict:
    """`trainer_state.json` of checkpoint `ckpt`, or a one-line UserError saying what is wrong with it; with `resume`
    its fp16 `loss_scaler` too (`judge_loss_scaler`), which only a resume or a rollback loads."""
    path = Path(ckpt) / STATE_FILE
    if not path.is_file():
        raise UserError(f"{ckpt}: no {STATE_FILE}, so this is not a complete checkpoint; pick another "
                        f"checkpoint-N or remove resume_from_checkpoint")
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: unreadable trainer state ({e}); resume from another checkpoint") from None
    if not isinstance(state, dict):
        raise UserError(f"{path}: not a JSON object; resume from another checkpoint")
    for key in ("global_step", "consumed_samples"):
        if not isinstance(state.get(key), int):
            raise UserError(f"{path}: missing or invalid `{key}`; resume from another checkpoint")
    if resume:
        judge_loss_scaler(path, state)
    return state


def judge_loss_scaler(path, state: dict) -> None:
    """A one-line UserError naming trainer state file `path` where `state`'s fp16 `loss_scaler` cannot be loaded
    (`loss_scaler_problem`). Asked where a resume or a rollback reads the state (`CheckpointDir.resume_state`), not
    by the readers of the weights alone (`eval`, `export`, `continue_training`), which never load the scale."""
    if "loss_scaler" in state and (wrong := loss_scaler_problem(state["loss_scaler"])):
        raise UserError(f"{path}: `loss_scaler`: {wrong} (delete the entry to start the scale at scale_loss); resume "
                        f"from another checkpoint")


FLOAT32_MAX, FLOAT32_NORMAL = 3.4028234663852886e38, 2.0 ** -126  # float32's largest finite and smallest normal


def loss_scaler_problem(entry) -> str | None:
    """What is wrong with a trainer state's `loss_scaler` (fp16's scale and counts: `precision.Amp.state_dict`), or
    None. Judged where a resume reads the state (`storage.intact.problem`), so a resume skips such a checkpoint (or
    refuses it by name) before its run writes anything, and `check` says so as well. The scale becomes a float32
    tensor: past float32's range it would be inf (every step an overflow, and the scale never comes back), below its
    normal range 0 or a subnormal; JSON's `true` is an int to Python, and no count."""
    if not isinstance(entry, dict):
        return f"{entry!r} is not an object of scale, incr_count and decr_count"
    scale = entry.get("scale")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not FLOAT32_NORMAL <= scale <= FLOAT32_MAX:
        return f"scale {scale!r} is not a finite, positive, normal float32 ({FLOAT32_NORMAL:.4g} to {FLOAT32_MAX:.4g})"
    for key in ("incr_count", "decr_count"):
        count = entry.get(key)
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            return f"{key} {count!r} is not an integer >= 0"
    return None


class CheckpointDir:
    """Checkpoint (or model) directory `path` and its metadata, each file read on first use and kept."""

    def __init__(self, path):
        self.path = Path(path)

    @classmethod
    def of(cls, ckpt) -> "CheckpointDir":
        """`ckpt` itself when it is one already (its files read once), else a new one for the path."""
        return ckpt if isinstance(ckpt, cls) else cls(ckpt)

    @property
    def name(self) -> str:
        return self.path.name

    def __fspath__(self) -> str:
        return str(self.path)

    def __str__(self) -> str:
        return str(self.path)

    @cached_property
    def state(self) -> dict:
        """The trainer state (`read_state`: a UserError naming the file when it is not a valid one), its fp16
        `loss_scaler` not judged: what the readers of a step, or of the weights alone, take."""
        return read_state(self.path, resume=False)

    @property
    def resume_state(self) -> dict:
        """`state` with its fp16 `loss_scaler` judged loadable (`judge_loss_scaler`): what a resume and a rollback
        read (`storage.intact.problem`, `training.trainer.Trainer.reload`)."""
        judge_loss_scaler(self.path / STATE_FILE, self.state)
        return self.state

    @cached_property
    def index(self) -> dict | None:
        """`checkpoint.index.json` (`checkpoint_index.load`, which checks it), or None for a directory without
        one (transformers', PaddleNLP's, a checkpoint from before the index)."""
        from pretrain_cli.storage import checkpoint_index

        return checkpoint_index.load(self.path)

    @cached_property
    def args(self) -> dict | None:
        """`args.json` as a JSON object, or None where it is absent or unreadable (a directory no run of ours
        wrote; what it holds is checked by those who read a key of it)."""
        try:
            obj = json.loads((self.path / ARGS_FILE).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            return None
        return obj if isinstance(obj, dict) else None

    @property
    def record(self) -> Path | None:
        """`args.json` when it is a run's own record (its `arguments` and `run`), else None."""
        return self.path / ARGS_FILE if is_record(self.args) else None

    @property
    def trained_length(self) -> int | None:
        """The longest max_seq_length the weights in this directory were trained at, over the runs that led to them
        (args.json's `trained_length`, which each run carries forward from the checkpoint it resumed or continued
        from: `orchestration.run_spec.RunSpec.trained_length`), None without an args.json holding `arguments` (no
        run of ours wrote the directory) or a length in it. A run continued past config.json's
        max_position_embeddings keeps that number there (`models.config.past_positions`), so the positions its
        weights were trained on are recorded here alone. An args.json from before the key: its run's max_seq_length
        (`run`), or one from before `run` its `arguments`' (read here for the length alone: `record`, and so the
        damage advice, take no args.json without `run` for a run's record)."""
        a = self.args
        if a is None or not isinstance(a.get("arguments"), dict):
            return None
        for length in (a.get("trained_length"), self.run("data", "max_seq_length"),
                       a["arguments"].get("max_seq_length")):
            if isinstance(length, int) and not isinstance(length, bool) and length > 0:
                return length
        return None

    def run(self, *keys):
        """`args.json`'s resolved run at `keys` (`run("loop", "micro_batch")`), or None where it does not say."""
        value = (self.args or {}).get("run")
        for key in keys:
            if not isinstance(value, dict):
                return None
            value = value.get(key)
        return value
