"""`pretrain-cli train` / `scripts/run_pretrain.py`: a straight line of `build_*` calls.

`prepare()` does every step that needs no Paddle (arguments, resolution, model config,
tokenizer, token files, batch arithmetic), so `check` shares it and bad input fails in well
under a second. `run()` then builds the model, optimizer, data and Trainer, and trains.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

from pretrain_cli.arg_parser import Arguments, parse_config
from pretrain_cli.config import ParallelConfig, derive_parallel
from pretrain_cli.errors import UserError
from pretrain_cli.resolve import Resolved, resolve


EPILOG = """Every key of the argument file (docs/COMPATIBILITY.md, or --help-keys) can follow the file as
--key value; later values win (default < file < command line). Bools take true/false/1/0, --flag alone
means true and --no_flag false. Examples:
  pretrain-cli train configs/demo_cpu.json --max_steps 100 --learning_rate 1e-3
  python -m paddle.distributed.launch --nproc_per_node 2 scripts/run_pretrain.py configs/demo_cpu.json"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--help-keys", action="store_true", help="list every argument-file key with its meaning")


@dataclass
class RunSpec:
    """Everything decided before Paddle is imported."""

    args: Arguments
    resolved: Resolved
    parallel: ParallelConfig
    model_dir: Path
    model_cfg: object  # models.config.ModelConfig
    tokenizer_dir: Path | None
    tokenizer: object | None = None
    data_lines: list = field(default_factory=list)

    @property
    def global_batch_size(self) -> int:
        t = self.args.training
        return t.per_device_train_batch_size * t.gradient_accumulation_steps * self.parallel.data_world_size

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.args.data.max_seq_length

    def summary(self) -> dict:
        return {
            "arguments": self.args.to_dict(),
            "resolved": self.resolved.to_dict(),
            "notes": list(self.resolved.notes),
            "model_dir": str(self.model_dir),
            "tokenizer_dir": str(self.tokenizer_dir) if self.tokenizer_dir else None,
            "global_batch_size": self.global_batch_size,
            "tokens_per_step": self.tokens_per_step,
            "total_tokens": self.tokens_per_step * max(self.args.training.max_steps, 0),
            "data": list(self.data_lines),
        }

    def describe(self) -> list[str]:
        a, r, p = self.args, self.resolved, self.parallel
        t = a.training
        changed = {k: v for k, v in a.to_dict().items() if k in a.explicit}
        lines = [f"arguments ({a.config_path or 'command line'}):"]
        lines += [f"  {k} = {json.dumps(v)}" for k, v in changed.items()]
        lines.append("resolved:")
        lines += [f"  note: {n}" for n in r.notes]
        cfg = self.model_cfg
        lines.append(f"  model: {cfg.model_type} from {self.model_dir} ({cfg.num_hidden_layers} layers, hidden "
                     f"{cfg.hidden_size}, heads {cfg.num_attention_heads}/{cfg.num_key_value_heads} kv, vocab "
                     f"{cfg.vocab_size}) {'pretrained weights' if a.model.continue_training else 'random init'}")
        lines.append(f"  tokenizer: {self.tokenizer_dir or 'none (checkpoints will carry no tokenizer files)'}")
        lines.append(f"  device {r.device}, precision {r.amp_dtype or 'float32'}, world {p.world_size} "
                     f"(dp {p.dp_degree}, sharding {p.sharding_degree} stage {p.sharding_stage})")
        lines.append(f"  batch: {t.per_device_train_batch_size} x acc {t.gradient_accumulation_steps} x "
                     f"{p.data_world_size} data ranks = {self.global_batch_size} sequences = "
                     f"{self.tokens_per_step:,} tokens/step; {t.max_steps} steps = "
                     f"{self.tokens_per_step * max(t.max_steps, 0):,} tokens")
        lines.append(f"  schedule: {t.lr_scheduler_type}, warmup {r.warmup_steps}, decay to "
                     f"{t.min_learning_rate} by step {r.decay_steps}; eval every {r.eval_steps} steps"
                     if t.do_eval else f"  schedule: {t.lr_scheduler_type}, warmup {r.warmup_steps}, decay to "
                     f"{t.min_learning_rate} by step {r.decay_steps}")
        lines += [f"  {line}" for line in self.data_lines]
        return lines


def build_args(config: str | None, overrides: list[str]) -> tuple[Arguments, Resolved]:
    if config is not None and not config.endswith(".json"):
        raise UserError(f"{config}: the argument file must be a .json file")
    args = parse_config(config, overrides)
    return args, resolve(args)


def build_model_config(args: Arguments):
    from pretrain_cli.models.config import ModelConfig, check_seq_len
    from pretrain_cli.presets import resolve_model_dir

    model_dir = resolve_model_dir(args.model.model_name_or_path)
    path = model_dir / "config.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: not a readable JSON model config ({e})") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path}: must hold a JSON object")
    if args.model.num_hidden_layers is not None:
        raw["num_hidden_layers"] = args.model.num_hidden_layers
    cfg = ModelConfig.from_dict(raw, source=str(path))
    cfg.validate()
    check_seq_len(cfg, args.data.max_seq_length)
    return model_dir, cfg


def build_tokenizer(args: Arguments, model_cfg):
    from pretrain_cli.presets import resolve_tokenizer_dir

    tok_dir = resolve_tokenizer_dir(args.model.tokenizer_name_or_path, args.model.model_name_or_path)
    if tok_dir is None:
        if args.data.sample_mode == "padded":
            raise UserError("tokenizer_name_or_path: sample_mode 'padded' needs a tokenizer for [BOT]/[EOT]/[PAD]; "
                            "set tokenizer_name_or_path to a tokenizer directory")
        return None, None
    from pretrain_cli.tokenizer import load_tokenizer

    tok = load_tokenizer(tok_dir)
    if tok.vocab_size > model_cfg.vocab_size:
        raise UserError(f"tokenizer_name_or_path: the tokenizer in {tok_dir} has {tok.vocab_size} tokens but the "
                        f"model's vocab_size is {model_cfg.vocab_size}; use a model config with vocab_size >= "
                        f"{tok.vocab_size} or a smaller tokenizer")
    return tok_dir, tok


def build_data(args: Arguments, resolved: Resolved, model_cfg, tokenizer):
    from pretrain_cli.data import build_datasets

    t = args.training
    need = tuple(name for name, flag in (("train", t.do_train), ("valid", t.do_eval), ("test", t.do_predict)) if flag)
    return build_datasets(
        input_dir=args.data.input_dir, split=args.data.split, max_seq_length=args.data.max_seq_length,
        seed=t.seed, sample_mode=args.data.sample_mode, tokenizer=tokenizer, data_cache=args.data.data_cache,
        need=need, vocab_size=model_cfg.vocab_size,
    )


def prepare(config: str | None, overrides: list[str]) -> RunSpec:
    args, resolved = build_args(config, overrides)
    parallel = derive_parallel(resolved, args.training)
    model_dir, model_cfg = build_model_config(args)
    if args.model.continue_training:
        from pretrain_cli.convert import find_weights

        find_weights(model_dir)  # raises a UserError naming the directory when there are no weights
    tok_dir, tok = build_tokenizer(args, model_cfg)
    spec = RunSpec(args, resolved, parallel, model_dir, model_cfg, tok_dir, tok)
    splits = build_data(args, resolved, model_cfg, tok)
    spec.data_lines = splits.describe()
    spec.splits = splits
    return spec


def main(ns: argparse.Namespace) -> int:
    if ns.help_keys:
        from pretrain_cli.arg_parser import KEYS

        for key, s in KEYS.items():
            print(f"--{key} ({s.section}, default {json.dumps(s.default)}): {s.help}")
        return 0
    spec = prepare(ns.config, ns.overrides)
    return run(spec)


# ---------------------------------------------------------------------------------------- run
def run_args_json(spec: RunSpec) -> dict:
    from pretrain_cli import __version__

    return {"version": __version__, "arguments": spec.args.to_dict(), "resolved": spec.resolved.to_dict(),
            "notes": list(spec.resolved.notes), "parallel": vars(spec.parallel).copy()}


def build_model(spec: RunSpec):
    import paddle

    from pretrain_cli import kernels
    from pretrain_cli.config import derive_kernels
    from pretrain_cli.models import build_model as build

    paddle.seed(spec.args.training.seed)
    chosen = kernels.select(derive_kernels(spec.args.training, spec.resolved.device), spec.resolved.device)
    model = build(spec.model_cfg, chosen)
    if spec.args.model.continue_training:
        from pretrain_cli.convert import load_weights

        load_weights(model, spec.model_cfg, str(spec.model_dir))
    return model, chosen


def find_resume(spec: RunSpec) -> Path | None:
    from pretrain_cli import checkpoint

    t = spec.args.training
    if t.resume_from_checkpoint:
        path = Path(t.resume_from_checkpoint)
        if not path.is_dir():
            raise UserError(f"resume_from_checkpoint: {path} is not a directory")
        return path
    if t.overwrite_output_dir or not t.do_train:
        return None
    return checkpoint.latest_checkpoint(t.output_dir)


def run(spec: RunSpec) -> int:
    """Build everything, train, evaluate, predict, save. Returns the process exit code."""
    from pretrain_cli.runtime import import_paddle

    paddle = import_paddle()
    from pretrain_cli import checkpoint, metrics, parallel
    from pretrain_cli.models.flops import flops_per_token
    from pretrain_cli.models.recompute import apply_recompute
    from pretrain_cli.optim import build_optimizer, build_schedule
    from pretrain_cli.precision import build_amp
    from pretrain_cli.trainer import NonFiniteError, Trainer

    a, t, r, p = spec.args, spec.args.training, spec.resolved, spec.parallel
    rank0 = parallel.is_rank0(p)
    metrics.setup_logging(p.rank)
    paddle.set_device(r.device)
    parallel.init_distributed(p, t.seed)
    parallel.start_watchdog(p)
    out = Path(t.output_dir)
    for line in spec.describe():
        metrics.log.info(line)

    model, chosen = build_model(spec)
    metrics.log.info(f"kernels: {chosen.describe()}")
    resume = parallel.agree_on_resume(p, find_resume(spec) if rank0 else None)
    if resume is not None:
        checkpoint.check_compatible(resume, spec.model_cfg, a.data.max_seq_length)
        state = checkpoint.read_state(resume)
        from pretrain_cli.convert import load_weights

        load_weights(model, spec.model_cfg, str(resume))
    if t.recompute:
        apply_recompute(model, t.recompute_granularity, t.recompute_use_reentrant, t.no_recompute_layers)
    schedule = build_schedule(t, r)
    optimizer = build_optimizer(model, t, schedule, multi_precision=r.amp_level == "O2" and r.amp_dtype is not None)
    raw_model = model
    model, optimizer, amp = build_amp(model, optimizer, r, t)
    if t.to_static:
        from pretrain_cli import kernels

        model = kernels.compile_forward(model)  # same object: raw_model and checkpoints are unaffected
    model = parallel.wrap_model(model, p)
    model, optimizer = parallel.wrap_optimizer(model, optimizer, p, offload=r.sharding_offload)
    comm = parallel.build_comm(p, optimizer, raw_model)
    if resume is not None:  # after AMP and sharding: O2 master weights and ZeRO-1 shards exist now
        checkpoint.load_optimizer(raw_model, optimizer, resume / checkpoint.OPTIMIZER_FILE)
    if rank0:  # only now that the resume checkpoint has fully loaded: a bad one leaves output_dir untouched
        out.mkdir(parents=True, exist_ok=True)
        checkpoint.clean_leftovers(out)
        if t.do_train:  # an eval-only run must not overwrite the training run's record
            checkpoint.write_json(out / "args.json", run_args_json(spec))

    cfg, seq = spec.model_cfg, a.data.max_seq_length
    peak, peak_source = metrics.resolve_peak(r.device, r.amp_dtype, t.peak_tflops) if t.do_train else (None, "")
    recompute = t.recompute_granularity if t.recompute else None
    throughput = metrics.Throughput(seq, spec.global_batch_size, p.world_size, p.data_world_size,
                                    flops_per_token(cfg, seq), flops_per_token(cfg, seq, recompute=recompute), peak)
    if t.do_train:
        metrics.log.info(f"flops: {flops_per_token(cfg, seq):.4g} model FLOPs/token (6N + 12·L·H·d·S), "
                         f"mfu against {peak_source}" if peak else f"flops: mfu unknown ({peak_source})")
    keep_until = state["global_step"] if resume is not None else (None if t.do_train else float("inf"))
    writer = metrics.MetricsWriter(str(out), t.logging_dir, t.report_to, keep_until) if rank0 else None
    dtype = r.amp_dtype if r.amp_level == "O2" and r.amp_dtype else "float32"

    save = checkpoint.Saver(out, raw_model, cfg, optimizer, comm, rank0, lambda: run_args_json(spec),
                            spec.tokenizer_dir, dtype, t.save_total_limit)

    trainer = Trainer(model, optimizer, schedule, spec.splits, a, r, p, throughput, writer, save, amp, comm)
    if resume is not None:
        trainer.load_state_dict(state)
        metrics.log.info(f"resumed from {resume} at step {trainer.state.global_step}, "
                         f"{trainer.state.consumed_samples} samples consumed")
    results = {}
    try:
        if t.do_train and trainer.state.global_step < t.max_steps:
            outcome = trainer.train()
            if outcome["stopped_by_signal"]:
                metrics.log.warning(f"stopped at step {trainer.state.global_step} and saved; re-run the same "
                                    f"command to resume")
                parallel.stop_watchdog()
                return 0
        if t.do_train:
            results.update(_train_results(trainer, spec))
        if t.do_eval:  # the loop may have just evaluated this very step: reuse it
            fresh = trainer.last_eval.get("global_step") == trainer.state.global_step
            results.update(trainer.last_eval if fresh else trainer.evaluate("valid"))
        if t.do_predict:
            results.update(trainer.evaluate("test"))
    except (NonFiniteError, UserError) as e:  # every rank stops here together: not a death
        parallel.stop_watchdog()
        raise UserError(str(e)) from None
    finally:  # any other error may be gloo reporting a dead peer: the watcher stays to name it
        if writer is not None:
            writer.close()
    parallel.stop_watchdog()  # past the last collective: a rank exiting from here on is not a death
    if rank0:
        from pretrain_cli import outputs

        with parallel.rank0_round(comm):
            outputs.write_final(out, raw_model, cfg, spec, trainer, results, dtype)
    else:
        comm.wait_for_rank0("writing the final model")
    return 0


def _train_results(trainer, spec: RunSpec) -> dict:
    s = trainer.state
    runtime = max(s.train_seconds, 1e-9)
    steps = max(s.global_step, 1)
    here = trainer.throughput.tokens_this_process
    return {"train_runtime": round(runtime, 4), "train_loss": s.loss_sum / steps, "global_step": s.global_step,
            "train_samples_per_second": round(s.consumed_samples / runtime, 4),
            # goodput: all tokens over all restarts' training time; and this process alone
            "train_tokens_per_second": round(s.tokens_seen / runtime, 4), "tokens_seen": s.tokens_seen,
            "effective_tokens_per_second_this_process": round(here / max(trainer.process_seconds, 1e-9), 4),
            "tokens_this_process": here, "skipped_steps": s.skipped_steps}
