"""The prepared run (`RunSpec`): the resolved configuration with what it points at, as `prepare` opened and checked
it, and what the run says of itself from that: its record (args.json), what every rank compares
(`RunSpec.fingerprint`), `check --json`'s summary and the description `check` and `train` print. Apart from
`prepare`, which builds it once, because the run is held and read long after: `training.run` records and describes
it, and a rank other than 0 re-decides it for rank 0's checkpoint (`RunSpec.resuming`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from pretrain_cli.counts import count
from pretrain_cli.storage.checkpoint_dir import CheckpointDir
from pretrain_cli.config.compute import attention_words
from pretrain_cli.config.expert import recorded
from pretrain_cli.config.moe import DEEPSEEK_ALPHA
from pretrain_cli.config.parser import Arguments
from pretrain_cli.run_config import RunConfig
from pretrain_cli.orchestration.resumed import apply_resume, resume_progress


# keys a node may set otherwise: paths (each node's mounts; what they hold is compared instead), what rank 0 alone
# acts on (its output records, its choice of the checkpoint every rank resumes from)
NODE_KEYS = ("model_name_or_path", "tokenizer_name_or_path", "input_dir", "data_cache", "output_dir", "logging_dir",
             "resume_from_checkpoint", "overwrite_output_dir", "report_to", "run_name")


@dataclass
class RunSpec:
    """A prepared run: the resolved configuration plus what it points at, opened and validated."""

    args: Arguments  # kept for the record (args.json) and the list of keys the user set
    run: RunConfig
    model_dir: Path
    model_cfg: object  # models.config.ModelConfig
    tokenizer_dir: Path | None = None
    tokenizer: object | None = None
    splits: object | None = None  # data.DataSplits
    data_lines: list = field(default_factory=list)
    # the checkpoint this run continues from: rank 0's choice (the other ranks of a launch take it once joined,
    # `training.same_run.resume`; before that they have chosen none, or the one resume_from_checkpoint names)
    resume: Path | None = None
    # what the resume's decisions start from: the arguments and run before them, and the launch they resolve for
    unresumed: tuple | None = None
    # (global_step, consumed_samples) of the checkpoint resumed: the steps before it read at its own global batch
    resumed_at: tuple | None = None
    held: str | None = None  # a live run's refusal of output_dir, which kept the resume from reading it (`in_use`)

    def resuming(self, path) -> RunSpec:
        """This run resuming from `path` (None: starting afresh) instead: a rank other than 0 taking rank 0's
        choice once joined (`training.same_run.resume`), and `train`'s fallback when the files of the checkpoint
        chosen here were found altered while reading them. The resume's checks (the model's shape and sequence length,
        the tokenizer) and decisions (batch, eval windows, schedule, optimizer settings, router bias) are made again
        for the checkpoint it now resumes from, as `prepare` made them for the first."""
        from pretrain_cli.training.resume_checks import check_compatible, check_tokenizer

        saved = CheckpointDir(path) if path is not None else None
        if saved is not None:
            check_compatible(saved, self.model_cfg, self.run.data.max_seq_length, bool(self.run.output.resume_from))
            check_tokenizer(saved, self.tokenizer, self.prefixes(), self.args)
        args, run = apply_resume(self, saved)
        return replace(self, resume=Path(path) if path is not None else None, args=args, run=run,
                       resumed_at=resume_progress(saved))

    def prefixes(self) -> list[str]:
        """The token files the run reads (none before they are opened)."""
        return [s["prefix"] for s in self.splits.sources] if self.splits is not None else []

    def train_samples(self) -> int:
        """The sequences the whole run reads by max_steps: a resumed run's checkpoint's own (at the global batch it
        had, which a batch key changed on resume makes another) and this run's steps after it; the batch line, the
        data line's epochs and `check --json` count it (they counted every step at this run's batch)."""
        lp, step, done = self.run.loop, *(self.resumed_at or (0, 0))
        if step >= lp.max_steps:  # nothing to train (`check`'s and `train`'s line says so): the file's arithmetic
            return max(lp.max_steps, 0) * self.run.global_batch_size
        return done + (lp.max_steps - step) * self.run.global_batch_size

    @property
    def user_args(self) -> Arguments:
        """The arguments as the user set them: before the resume's decisions, which set keys (`unresumed`)."""
        return self.unresumed[0] if self.unresumed is not None else self.args

    def record(self) -> dict:
        """What args.json holds: the arguments as the run takes them (`arguments`, with the keys a resume set: the
        accumulation that kept the global batch on another number of processes), as the user set them
        (`user_arguments`: what the next resume compares its own with, so that it tells a batch key the user
        changed from one a resume derived: `orchestration.resumed.keep_global_batch`), both with PaddleNLP's keys
        that take effect through the layout (`config.expert.recorded`), and as resolved; the
        longest length its weights have trained at (`trained_length`); and the tokenizer they train with
        (`tokenizer`: `tokenizer_lineage.trained_with`, what a resume from a checkpoint without tokenizer files is
        checked by); and the directory it was started in (`working_directory`: what its relative paths were read
        from, which `eval` from elsewhere names)."""
        from pretrain_cli import __version__
        from pretrain_cli.training.tokenizer_lineage import trained_with

        tokenizer = trained_with(self.tokenizer, self.prefixes(),
                                 (self.resume, self.model_dir if self.run.model.continue_training else None))
        return {"version": __version__, "arguments": recorded(self.args), "user_arguments": recorded(self.user_args),
                "run": self.run.to_dict(), "notes": list(self.run.notes), "trained_length": self.trained_length(),
                "tokenizer": tokenizer, "working_directory": str(Path.cwd())}  # (what its relative paths meant)

    def trained_length(self) -> int:
        """This run's max_seq_length, or the longer one the weights it starts from were trained at (the checkpoint it
        resumes, the run directory it continues: `CheckpointDir.trained_length`): a run trained at 96 then continued
        at 32 has trained its weights on positions up to 96, which eval and generate read beside config.json."""
        from pretrain_cli.storage.checkpoint_dir import CheckpointDir

        starts = (self.resume, self.model_dir if self.run.model.continue_training else None)
        before = [CheckpointDir(p).trained_length for p in starts if p is not None]
        return max([self.run.data.max_seq_length, *(n for n in before if n is not None)])

    def fingerprint(self) -> dict:
        """What every rank of a run must agree on (`training.same_run`): the arguments as the user set them, before
        the resume's decisions (which rank 0 alone makes: the others take them once joined, `same_run.resume`),
        without the paths, which may differ between nodes (their mounts), nor the keys only rank 0 acts on; what
        the paths hold instead."""
        out = {k: v for k, v in self.user_args.to_dict().items() if k not in NODE_KEYS}
        out["model config.json"] = self.model_cfg.to_hf_dict()
        out["tokenizer vocabulary"] = getattr(self.tokenizer, "vocab_size", None)
        out["token files"] = [line.removeprefix("data: ").split(";")[0] for line in self.data_lines]  # (the rest: seq)
        return out

    def summary(self) -> dict:
        """`check --json`."""
        return {**self.record(), "model_dir": str(self.model_dir),
                "tokenizer_dir": str(self.tokenizer_dir) if self.tokenizer_dir else None,
                "global_batch_size": self.run.global_batch_size, "tokens_per_step": self.run.tokens_per_step,
                "total_tokens": self.train_samples() * self.run.data.max_seq_length,
                "resume": str(self.resume) if self.resume else None, "data": list(self.data_lines)}

    def _no_tokenizer(self) -> str:
        """The tokenizer line of a run without one; a model directory with only a sentencepiece model (Llama 2's,
        PaddleNLP's) says so, since eval and generate on the run's output will want its tokenizer.json."""
        from pretrain_cli.config.presets import sentencepiece_model

        sp = sentencepiece_model(self.model_dir)
        return "none (checkpoints will carry no tokenizer files)" + (
            f"; {self.model_dir} holds a sentencepiece model ({sp}), which is not read: set tokenizer_name_or_path "
            f"to a directory with its tokenizer.json (docs/DATA.md, \"Tokenizers and transformers\")" if sp else "")

    def _mtp_weight_source(self) -> str:
        """Where the MTP loss's weight came from (`config.moe.mtp_weight`), so a PaddleNLP file, whose weight
        defaults to 1.0 there, is never trained at our 0.3 unsaid."""
        if "mtp_loss_weight" in self.args.explicit:
            return ""
        if self.unresumed is not None and self.resume is not None and \
                self.unresumed[1].moe.mtp_loss_weight != self.run.moe.mtp_loss_weight:  # (`resumed.loss_weights`)
            return f" (kept from {Path(self.resume).name}'s run)"
        if "num_nextn_predict_lambda" in self.model_cfg.extra:
            return " (config.json's num_nextn_predict_lambda)"
        return (" (mtp_loss_weight's default, DeepSeek-V3's first λ; PaddleNLP's num_nextn_predict_lambda defaults to "
                "1.0: set mtp_loss_weight 1.0 to train as it does)")

    def describe(self) -> list[str]:
        a, r = self.args, self.run
        lp, cfg = r.loop, self.model_cfg
        lines = [f"arguments ({a.config_path or 'command line'}):"]
        lines += [f"  {k} = {json.dumps(v, ensure_ascii=False)}" for k, v in a.to_dict().items() if k in a.explicit]
        lines.append("resolved:")
        lines += [f"  note: {n}" for n in r.notes]
        if self.resume is not None:
            start = f"resumes from {self.resume}"
        else:
            start = "pretrained weights" if r.model.continue_training else "random init"
        mtp = int(cfg.num_nextn_predict_layers or 0)  # DeepSeek-V3's multi-token prediction layers, built too
        weight = f"; MTP loss weight {r.moe.mtp_loss_weight:g}{self._mtp_weight_source()}" if mtp else ""
        mtp = f" + {mtp} MTP (multi-token prediction) layer{'s' if mtp > 1 else ''}" if mtp else ""
        m = self.args.model
        lines.append(f"  model: {cfg.model_type} from {_named(self.model_dir, m.model_name_or_path)} "
                     f"({cfg.num_hidden_layers} layers{mtp}, hidden "
                     f"{cfg.hidden_size}, heads {cfg.num_attention_heads}/{cfg.num_key_value_heads} kv, vocab "
                     f"{cfg.vocab_size}); {start}{weight}")
        if cfg.expert_layers:
            lines.append(f"  {self._experts()}")
        tok = m.tokenizer_name_or_path or m.model_name_or_path  # (a tokenizer found beside the model: its name)
        lines.append(f"  tokenizer: {_named(self.tokenizer_dir, tok) if self.tokenizer_dir else self._no_tokenizer()}")
        lines.append(f"  device {r.device}, precision {r.precision.amp_dtype or 'float32'}"
                     f"{' ' + r.precision.level if r.precision.enabled else ''}; {r.parallel.describe()}; "
                     f"attention "
                     f"{attention_words(r.kernels, r.device, r.data.attention_mask_type, r.parallel.cp_degree)}, "
                     f"{r.data.attention_mask_type} mask"
                     f"{' (positions restart per document)' if r.data.reset_position_ids else ''}; "
                     f"recompute {r.recompute_granularity or 'off'}")
        ranks, batch = count(r.parallel.data_world_size, "data rank"), count(r.global_batch_size, "sequence")
        samples, (step, done) = self.train_samples(), self.resumed_at or (0, 0)
        before = (f" ({self.resume.name}'s {done:,} sequences, then {count(lp.max_steps - step, 'step')} of "
                  f"{r.global_batch_size})" if samples != max(lp.max_steps, 0) * r.global_batch_size else "")
        lines.append(f"  batch: {lp.micro_batch} x acc {lp.grad_accum} x {ranks} = {batch} = {r.tokens_per_step:,} "
                     f"tokens/step; {count(lp.max_steps, 'step')} = {samples * r.data.max_seq_length:,} tokens{before}")
        if r.parallel.distributed:
            p = r.parallel
            split = (f" x pp {p.pp_degree} stages" if p.pp_degree > 1 else "") + f" x tp {p.tp_degree}"
            split += f" x cp {p.cp_degree} (each holds 1/{p.cp_degree} of every sequence)" if p.cp_degree > 1 else ""
            lines.append(f"  ranks: {p.world_size} processes = {ranks}{split}; each data rank reads "
                         f"{count(lp.micro_batch * lp.grad_accum, 'sequence')} ({lp.micro_batch} per micro-step) = "
                         f"{lp.micro_batch * lp.grad_accum * r.data.max_seq_length:,} tokens per step")
        # the resume note's words: a restarted schedule's steps counted as the run counts them
        lines.append(f"  schedule: {r.schedule.describe()}" + (f"; {self._evaluations()}" if lp.do_eval else ""))
        lines += [f"  {line}" for line in self.data_lines]
        lines.append(f"  report_to: metrics.jsonl + {', '.join(r.output.report_to) or 'no tracker'}")
        return lines

    def _experts(self) -> str:
        """A MoE model's routing as this run trains it: config.json's experts (their number and width, the layers
        that hold them, the MTP layer counted apart as the model line counts it; each size config.json leaves to
        transformers' default says so), top-k and `norm_topk_prob`, and the balancing decided in `config.moe` (the
        weight in effect where the file leaves it to config.json or the paper, the bias rate a DeepSeek-V3 run gets
        unasked), the expert groups a DeepSeek router keeps, and the capacity (`_capacity`), so a run's size,
        balancing and dropped tokens are read before its first step."""
        cfg, moe, p = self.model_cfg, self.run.moe, self.run.parallel

        def said(*keys) -> str:  # the keys of this figure config.json left out: transformers' default built it
            left = [k for k in keys if k in cfg.defaulted]
            return f" (transformers' default: config.json has no {' or '.join(left)})" if left else ""

        width = f"{cfg.moe_intermediate_size} wide each{said('moe_intermediate_size')}"
        if cfg.shared_expert_intermediate_size:  # Qwen2-MoE: one shared expert of its own width
            experts = (f"{cfg.num_experts} routed{said('num_experts')}, {width}, + 1 shared, "
                       f"{cfg.shared_expert_intermediate_size} wide{said('shared_expert_intermediate_size')}")
        else:
            experts = (f"{cfg.num_experts} routed{said('num_experts')} + {cfg.n_shared_experts} "
                       f"shared{said('n_shared_experts') if cfg.mla else ''}, {width}")
        mtp = len(cfg.expert_layers) - len(cfg.sparse_layers)  # the MTP layers that hold experts
        mtp = " + the MTP layer" if mtp == 1 else f" + {mtp} MTP layers" if mtp else ""
        kind = "sequence-wise" if cfg.model_type in DEEPSEEK_ALPHA else f"load-balancing, {moe.aux_loss_scope} scope"
        groups = (f" of the top {cfg.topk_group} of {cfg.n_group} expert groups{said('n_group', 'topk_group')}"
                  if cfg.mla and cfg.topk_method != "greedy" else "")  # (V3's noaux_tc, V2's group_limited_greedy)
        rate = f"{moe.bias_update_rate:g}" if moe.bias_update_rate else "0 (off)"
        return (f"experts: {experts}, in {len(cfg.sparse_layers)} of {cfg.num_hidden_layers} layers{mtp}"
                f"{said('first_k_dense_replace', 'decoder_sparse_step')}, top-{cfg.num_experts_per_tok}"
                f"{said('num_experts_per_tok')}{groups}, norm_topk_prob {json.dumps(bool(cfg.norm_topk_prob))}; "
                f"balance loss weight {moe.aux_loss_coef or 0:g} ({kind}), moe_router_bias_update_rate {rate}; "
                f"{self._capacity()}; expert parallel degree {p.ep_degree}")

    def _capacity(self) -> str:
        """`capacity_factor` as what it keeps at this run's micro-batch (`planning.experts.capacity_words`, the words
        `plan`'s capacity line says it in too)."""
        from pretrain_cli.planning.experts import capacity_words

        cfg = self.model_cfg
        tokens = self.run.loop.micro_batch * self.run.data.max_seq_length  # one forward's tokens on one data rank
        return capacity_words(self.run.moe.capacity_factor, tokens, cfg.num_experts_per_tok, cfg.num_experts)

    def _evaluations(self) -> str:
        """When the run evaluates: every eval_steps in the loop, and after the last step (`training.run`'s final
        results, the loop's own when it just evaluated); under `epoch` only then (PaddleNLP's one epoch:
        `resolve._intervals`)."""
        lp = self.run.loop
        if not lp.do_train:
            return "eval once (no training steps)"
        if lp.eval_steps >= lp.max_steps:
            past = lp.eval_steps > lp.max_steps and self.args.training.evaluation_strategy != "epoch"
            return f"eval once, after the last step (step {lp.max_steps}{'; eval_steps is past it' if past else ''})"
        every = f"eval every {count(lp.eval_steps, 'step')}"
        return every if lp.max_steps % lp.eval_steps == 0 else f"{every} and after the last step ({lp.max_steps})"


def _named(path: Path, typed: str | None) -> str:
    """A model or tokenizer directory as `check` names it: a shipped preset by its name, with the hub name the file
    gave (`typed`) where that was one ("preset qwen2-0.5b (Qwen/Qwen2-0.5B)"), not the package directory holding it
    (".../src/pretrain_cli/config/presets/micro-qwen2-moe", a path no one typed); any other directory by its path."""
    from pretrain_cli.config.presets import ALIASES, is_preset

    if not is_preset(path):
        return str(path)
    hub = typed if typed and ALIASES.get(typed.lower()) == path.name else None
    return f"preset {path.name}" + (f" ({hub})" if hub else "")
