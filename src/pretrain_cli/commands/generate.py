"""`pretrain-cli generate`: prompt → text from a checkpoint, an HF model directory or a preset.

Greedy when `--temperature 0`; otherwise seeded sampling (same seed, same text). The tokenizer
comes from `--tokenizer` or from the model directory (our checkpoints carry tokenizer files); the
kernels from the run that wrote the directory (its args.json, with `--key value` overrides), as `train`
resolved them, or, for a model no run wrote, the kernel keys alone. It stops where transformers' `generate`
stops on the same directory (`_stop_ids`). A `--prompt_file` is many `--prompt` calls with the model loaded
once: each prompt alone, with the same seed, so a prompt's text does not depend on the others (no batch, no
padding). The text after the prompt is `data.generated_text`'s: the whole sequence decoded past the prompt (the
new ids alone where the prompt's byte tokens fuse with theirs), a character `--max_new_tokens` cut held back, and
bytes that form no character counted in a note.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from pretrain_cli.errors import UserError
from pretrain_cli.json_mistakes import loads

# `--key value`: the training keys, applied to the record of the run that wrote --model, or, for a model no run
# wrote, the kernel keys alone
TAKES_RUN_OVERRIDES = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage = "pretrain-cli generate --model DIR (--prompt TEXT | --prompt_file FILE) [options] [--key value ...]"
    parser.epilog = ("--key value after the options: training keys (docs/COMPATIBILITY.md) applied to the settings of "
                     "the run that wrote --model (its args.json), as `train` applies them, or, for a model no run "
                     "wrote, the kernel keys alone: e.g. --use_flash_attention false or --cpu_fused_ops false to "
                     "generate with other kernels")
    parser.add_argument("--model", required=True,
                        help="checkpoint / HF model directory, or a preset (random init); a run's output_dir "
                             "without its final model stands for its newest checkpoint")
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt",
                        help="text to continue (this or --prompt_file is required); once prompt + generated tokens "
                             "exceed the model's max_position_embeddings (or the longer max_seq_length the run that "
                             "wrote --model trained at), the model sees only the last that many (a note says so)")
    prompt.add_argument("--prompt_file",
                        help="many prompts, the model loaded once (this or --prompt is required): a .jsonl file of "
                             "objects with a \"prompt\" (or \"text\") string, else one prompt per non-empty line; "
                             "each continued as --prompt would (same seed, same text), printed in order, a blank line "
                             "between them (--json: one object per line)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the model directory)")
    parser.add_argument("--max_new_tokens", type=int, default=64, help="tokens to generate (default: %(default)s)")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="0 = greedy; > 0 samples (default: %(default)s)")
    parser.add_argument("--top_k", type=int, default=0,
                        help="sample from the k most likely tokens; 0 = all (default: %(default)s)")
    parser.add_argument("--top_p", type=float, default=1.0,
                        help="nucleus sampling: the smallest set of tokens with this probability mass "
                             "(default: %(default)s)")
    parser.add_argument("--seed", type=int, default=42,
                        help="sampling seed, and init seed for a model without weights (a config.json alone, a "
                             "preset), as `train` and `eval` seed one: the run's seed default; in [0, 2^32) "
                             "(default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the text")


def _check_options(ns: argparse.Namespace) -> None:
    """Refuse sampling options that would fail deep inside numpy or Paddle with a traceback (nan probabilities,
    a negative seed) or sample nonsense (inf temperature: uniform noise), before anything is loaded."""
    if ns.max_new_tokens < 1:
        raise UserError(f"--max_new_tokens: must be >= 1, got {ns.max_new_tokens}")
    if not (math.isfinite(ns.temperature) and ns.temperature >= 0):
        raise UserError(f"--temperature: must be a finite number >= 0 (0 = greedy), got {ns.temperature}")
    if not 0 < ns.top_p <= 1:  # (nan fails both comparisons)
        raise UserError(f"--top_p: must be in (0, 1] (1 = no nucleus cut), got {ns.top_p}")
    if ns.top_k < 0:
        raise UserError(f"--top_k: must be >= 0 (0 = all tokens), got {ns.top_k}")
    if not 0 <= ns.seed < 2**32:  # train's range for its seed
        raise UserError(f"--seed: must be in [0, 2^32), got {ns.seed}")


def _prompts(ns: argparse.Namespace) -> list[tuple[str, str]]:
    """[(where, text)]: `--prompt`, or each prompt of `--prompt_file` with its line (what an error names)."""
    if ns.prompt_file is None:
        return [("--prompt", ns.prompt)]
    path = Path(ns.prompt_file)
    try:
        # only \n ends a line: splitlines also cuts at U+2028 and U+0085, which a JSON string may hold as they are
        lines = [line.removesuffix("\r") for line in path.read_text(encoding="utf-8-sig").split("\n")]
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"--prompt_file: cannot read {path} ({getattr(e, 'strerror', None) or e})") from None
    prompts = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        if path.suffix == ".jsonl":
            obj = loads(line, str(path), "one object per line", fix="one object per line", line=n)
            text = obj.get("prompt", obj.get("text")) if isinstance(obj, dict) else None
            if not isinstance(text, str):
                raise UserError(f"{where}: needs a \"prompt\" (or \"text\") string")
            line = text
        prompts.append((where, line))
    if not prompts:
        raise UserError(f"--prompt_file: {path} holds no prompt; one per line (.jsonl: {{\"prompt\": ...}} per line)")
    return prompts


def _window_note(prompt_len: int, new_tokens: int, limit: int, what: str = "--prompt",
                 whose: str | None = None) -> str | None:
    """Where the context outgrew the model's window (`models.generation.context_window`: `limit`, and `whose`
    number it is), the model saw a sliding window of the last `limit` tokens
    (`models.generation.first_slid_token`): the text from there on is not what a model reading the whole context
    would write, so say from which token on."""
    from pretrain_cli.models.generation import first_slid_token

    first = first_slid_token(prompt_len, new_tokens, limit)
    if first is None:
        return None
    whose = whose or f"the model's max_position_embeddings ({limit})"
    if prompt_len > limit:
        return (f"note: {what} is {prompt_len} tokens, more than {whose}: "
                f"it saw only the last {limit} (the first {prompt_len - limit} were dropped), a window that slid on "
                f"with every generated token")
    which = "" if what == "--prompt" else f" ({what})"
    return (f"note: prompt + generated tokens{which} exceeded {whose} from generated "
            f"token {first} of {new_tokens} on: from there the model saw only the last {limit} tokens, a window "
            f"that slid on with every generated token")


def _stop_ids(model_dir, cfg, tok) -> set[int]:
    """Where generation ends: the EOS ids transformers' `generate` stops at on this directory (its
    generation_config.json's `eos_token_id`, one id or a list, else config.json's; `ModelConfig.from_file` read
    that file, an unreadable one already one line), and the tokenizer's EOS (the id `preprocess --append_eos` ended
    every document with)."""
    from pretrain_cli.models.generation import stop_ids

    eos = cfg.generation.get("eos_token_id", cfg.eos_token_id)
    try:
        stops = stop_ids(eos)
    except (TypeError, ValueError):
        where = "generation_config.json" if "eos_token_id" in cfg.generation else "config.json"
        raise UserError(f"{Path(model_dir) / where}: eos_token_id must be a token id or a list of them, got "
                        f"{eos!r}") from None
    return stops | stop_ids(tok.eos_token_id)


def main(ns: argparse.Namespace) -> int:
    _check_options(ns)
    from pretrain_cli.orchestration.targets import inference_kernels
    from pretrain_cli.config.presets import has_tokenizer, resolve_model_dir
    from pretrain_cli.orchestration.recorded import model_argument, no_effect, run_arguments
    from pretrain_cli.data.tokenizer import load_tokenizer
    from pretrain_cli.models.config import ModelConfig

    name, note = model_argument(ns.model)  # a run stopped before its export: its newest checkpoint
    if note:
        print(note, file=sys.stderr)
    model_dir = resolve_model_dir(name, key="--model")
    from pretrain_cli.models.foreign_weights import random_init_note, refuse_unread

    refuse_unread(model_dir, "--model")  # weights in files not read: refused, never generated from at random init
    overrides = list(getattr(ns, "overrides", None) or [])
    args, _, notes = run_arguments(None, model_dir, overrides, "generate")
    no_effect(overrides, "generate")  # only the kernels: said, not ignored
    for note in notes:  # (a kernel key that changes no kernel here)
        print(note, file=sys.stderr)
    tok_dir = ns.tokenizer or (model_dir if has_tokenizer(model_dir) else None)
    if tok_dir is None:
        from pretrain_cli.data.token_file_tokenizers import tokenizer_named
        from pretrain_cli.training.tokenizer_lineage import recorded

        rec = recorded(model_dir)  # (a run without a tokenizer: its args.json names the one its data was made with)
        raise UserError(f"--model: {model_dir} has no tokenizer files; pass --tokenizer DIR"
                        + (f" ({model_dir} was trained with {tokenizer_named(rec)}, as its args.json records it)"
                           if rec else ""))
    tok = load_tokenizer(tok_dir)
    prompts = []
    for where, text in _prompts(ns):
        ids = tok.encode(text)
        if not ids:
            raise UserError(f"{where}: the prompt encodes to no tokens; give some text")
        prompts.append((where if where == "--prompt" else f"the prompt at {where}", text, ids))
    from pretrain_cli.models import position_checks
    from pretrain_cli.models.model_files import has_weights
    from pretrain_cli.models.generation import context_window, generate
    from pretrain_cli.storage.checkpoint_dir import CheckpointDir
    from pretrain_cli.training.weight_source import load_for_inference

    pretrained = has_weights(model_dir)
    cfg = ModelConfig.from_file(str(model_dir), pretrained=pretrained)  # (the window: judged below)
    stops = _stop_ids(model_dir, cfg, tok)  # (a bad generation_config.json: one line, before the model loads)
    # the window slides at the length the weights were trained to read (the run's, past config.json's number)
    limit, whose = context_window(cfg.max_position_embeddings, CheckpointDir(model_dir).trained_length)
    # the sequences are judged as `train` judges its samples (`position_checks.length_notes`: pretrained weights'
    # sliding window and dynamic_ntk range; a model without weights is the one `train` builds for that length, never
    # refused), once, at the longest sequence a forward reads: the longest prompt and its new tokens but the last
    # (new token j is predicted from the prompt and the j - 1 before it; the last is never read back), at most
    # `limit`, where `generate` slides its context (it reads the last `limit` tokens afresh). A window of `limit` or
    # more is never reached. Refused, a prompt that alone reads past is named with its count (judged again only
    # then): no --max_new_tokens helps it.
    where, _, ids = max(prompts, key=lambda p: len(p[2]))
    longest, source = min(len(ids) + ns.max_new_tokens - 1, limit), str(Path(model_dir) / "config.json")
    key = "the prompt's tokens" if where == "--prompt" else f"the tokens of {where}"
    alone = f"the {len(ids)} tokens of {'the prompt' if where == '--prompt' else where}"
    try:
        notes = position_checks.length_notes(cfg, source, longest, f"{key} + --max_new_tokens - 1", pretrained)
    except UserError:
        position_checks.length_notes(cfg, source, min(len(ids), limit), f"{alone} (only a shorter prompt helps: a "
                                   f"forward reads the whole prompt at any --max_new_tokens)", pretrained)
        raise
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    model, source = load_for_inference(model_dir, cfg, ns.seed, *inference_kernels(arguments=args, model_cfg=cfg))
    if source != "trained weights":  # said once, before any text
        from pretrain_cli.config.presets import is_preset

        print(random_init_note(name, is_preset(model_dir), ns.seed), file=sys.stderr)
    print(f"kernels: {model.kernels.describe()}", file=sys.stderr)
    from pretrain_cli.data.generated_text import decoder_kind, generated_text, text_notes

    kind = decoder_kind(tok)  # (once per tokenizer, not per prompt)
    if tok.vocab_size > cfg.vocab_size:
        raise UserError(f"--tokenizer: {tok.vocab_size} tokens but the model's vocab_size is {cfg.vocab_size}")
    for i, (where, prompt, ids) in enumerate(prompts):
        out = generate(model, [ids], ns.max_new_tokens, temperature=ns.temperature, top_k=ns.top_k, top_p=ns.top_p,
                       eos_token_id=stops, seed=ns.seed, max_length=limit)
        new = [int(t) for t in out[0][len(ids):]]
        window = _window_note(len(ids), len(new), limit, where, whose)
        if window:
            print(window, file=sys.stderr)
        ended = [j for j, t in enumerate(new) if t in stops]
        if ended:
            new = new[: ended[0]]
        done = generated_text(tok, kind, ids, new, cut=not ended and len(new) == ns.max_new_tokens)
        for note in text_notes(done, ns.max_new_tokens, where):
            print(note, file=sys.stderr)
        if ns.json:
            print(json.dumps({"prompt": prompt, "completion": done.text, "tokens": new, "invalid_bytes":
                              done.invalid_bytes, "cut_bytes": done.cut_bytes, "model": str(model_dir),
                              "model_weights": source, "kernels": model.kernels.describe()},
                             ensure_ascii=False), flush=True)
        else:
            print(("\n" if i else "") + prompt + done.text, flush=True)
    return 0
