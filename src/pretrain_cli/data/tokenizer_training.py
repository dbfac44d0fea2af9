"""Byte-level BPE training: the work behind `pretrain-cli train-tokenizer` (`data.tokenizer` loads and exports
what it writes). It trains with Qwen2's pipeline (`tokenizer._qwen2_pipeline`), so transformers' `Qwen2Tokenizer`,
which rebuilds that pipeline from its own recipe, gives the ids the data holds
(docs/DATA.md, "Tokenizers and transformers")."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

from pretrain_cli import atomic
from pretrain_cli.counts import count
from pretrain_cli.data.tokenizer import _FALLBACK, DEFAULT_SPECIALS, Tokenizer, _qwen2_pipeline, load_tokenizer
from pretrain_cli.errors import UserError


def train_bpe(texts, vocab_size: int, special_tokens: list[str], min_frequency: int = 2, length: int | None = None):
    """Byte-level BPE: every byte is in the alphabet, so no text is ever unencodable."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers, trainers

    tok = HFTokenizer(models.BPE())
    _qwen2_pipeline(tok)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    _interruptible(lambda: tok.train_from_iterator(texts, trainer=trainer, length=length))
    return tok


def _interruptible(work) -> None:
    """Run `work` on a daemon thread while the main thread waits for it, so that a Ctrl-C ends the command at once.

    Why: the Rust BPE trainer runs its merges without returning to Python, where a signal handler could raise
    KeyboardInterrupt, and its reading of the iterator did not stop on one either: a Ctrl-C in `train-tokenizer`
    was answered only when the whole training had ended (7 s after the key on a 13 MB corpus; hours on a large one).
    It releases the GIL meanwhile, so the waiting main thread takes the KeyboardInterrupt as it comes; the thread,
    a daemon, ends with the process, before anything is written."""
    import threading

    failed = []

    def run():
        try:
            work()
        except BaseException as e:  # handed to the main thread, which raises it as the trainer's own
            failed.append(e)

    thread = threading.Thread(target=run, name="train-tokenizer", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.1)
    if failed:
        raise failed[0]


def roles_by_position(special_tokens: list[str]) -> dict[str, str]:
    """`train-tokenizer --special_tokens PAD BOS EOS UNK [EXTRA...]`: the first four are the pad, bos, eos and unk
    tokens whatever their names (a name-based guess left `<p> <b> <e> <u>` without an EOS, which `preprocess
    --append_eos` then lacks); further ones are special tokens with no role (kept whole in text). Fewer than four,
    an empty or blank token, or one given twice (which the trainer would silently keep once) are refused."""
    tokens = list(special_tokens)
    blank = next((i for i, t in enumerate(tokens) if not t.strip()), None)
    if blank is not None:
        raise UserError(f"--special_tokens: token {blank + 1} is empty or blank; pass non-blank tokens")
    twice = next((t for i, t in enumerate(tokens) if t in tokens[:i]), None)
    if twice is not None:
        raise UserError(f"--special_tokens: {twice!r} is given twice; pass each token once")
    if len(tokens) < len(_FALLBACK):
        raise UserError(f"--special_tokens: {len(tokens)} tokens, but the first four are the pad, bos, eos and unk "
                        f"tokens, in that order (e.g. {' '.join(DEFAULT_SPECIALS)}); pass at least four")
    return dict(zip(("pad", "bos", "eos", "unk"), tokens))


def _check_output_dir(out: Path) -> None:
    """Refused before any training: a file, or a directory holding model weights, whose token ids a new
    tokenizer would no longer match (a directory with only a config.json, or an older tokenizer, is fine)."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--output_dir {out}: is a file, not a directory; choose a directory")
    weights = [n for n in ("model.safetensors", "model.safetensors.index.json") if (out / n).is_file()]
    weights += sorted(p.name for p in out.glob("checkpoint-*") if p.is_dir())[:1] if out.is_dir() else []
    if weights:
        raise UserError(f"--output_dir {out}: holds a trained model ({weights[0]}), whose token ids a new tokenizer "
                        f"would not match; choose another directory")


def train_tokenizer(ns) -> int:
    """Train a byte-level BPE on `ns.input_path` and save it to `ns.output_dir` (the command's options)."""
    from pretrain_cli.data.documents import DocumentReader, count_documents

    _check_output_dir(Path(ns.output_dir))
    roles = roles_by_position(ns.special_tokens)
    min_vocab = 256 + len(ns.special_tokens)
    if ns.vocab_size < min_vocab:
        raise UserError(f"--vocab_size: {ns.vocab_size} is below the byte alphabet plus special tokens "
                        f"({min_vocab}); pass at least {min_vocab}")
    reader = DocumentReader(ns.input_path, ns.json_key, ns.skip_bad_lines, note=lambda line: print(line, file=sys.stderr))
    n_docs = count_documents(ns.input_path)  # cheap line count: tqdm and the trainer want a length
    from tqdm import tqdm

    texts = tqdm(reader, total=n_docs, unit="doc", desc="train-tokenizer", file=sys.stderr,
                 disable=not sys.stderr.isatty())
    tok = train_bpe(texts, ns.vocab_size, list(ns.special_tokens), ns.min_frequency, n_docs)
    if reader.documents == 0:
        raise UserError(f"--input_path: no non-empty documents in {' '.join(ns.input_path)}; check the files and --json_key")
    out = Path(ns.output_dir)
    if out.exists():  # keep unrelated files (e.g. a model config); each of ours is replaced atomically
        Tokenizer(tok, str(out), roles, "").save(out)
    else:  # a new directory appears complete or not at all
        tmp = atomic.tmp_path(out)
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            Tokenizer(tok, str(out), roles, "").save(tmp)
            atomic.publish_dir(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    loaded = load_tokenizer(out)
    extra = f", extra {' '.join(ns.special_tokens[4:])}" if len(ns.special_tokens) > 4 else ""
    print(f"train-tokenizer: {count(reader.documents, 'document')} -> {out} (vocab {loaded.vocab_size}, pad={roles['pad']} "
          f"bos={roles['bos']} eos={roles['eos']} unk={roles['unk']}{extra}, fingerprint {loaded.fingerprint[:12]})")
    if loaded.vocab_size < ns.vocab_size:  # the trainer ran out of frequent pairs: said, as a model sized to the
        lower = " or --min_frequency 1" if ns.min_frequency > 1 else ""  # number asked for would not match it
        print(f"note: --vocab_size {ns.vocab_size}: the corpus gave {loaded.vocab_size} tokens: every merge seen at "
              f"least --min_frequency {ns.min_frequency} times is learned; more text{lower} gives more",
              file=sys.stderr)
    if reader.bad_lines:
        print(f"train-tokenizer: skipped {reader.bad_lines} bad lines", file=sys.stderr)
    return 0
