"""Byte-level BPE training: the work behind `pretrain-cli train-tokenizer` (`data.tokenizer` loads and exports
what it writes). It trains with Qwen2's pipeline (`tokenizer_ids.qwen2_pipeline`), so transformers' `Qwen2Tokenizer`,
which rebuilds that pipeline from its own recipe, gives the ids the data holds
(docs/DATA.md, "Tokenizers and transformers")."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

from pretrain_cli import atomic
from pretrain_cli.counts import count
from pretrain_cli.data.tokenizer import _FALLBACK, DEFAULT_SPECIALS, Tokenizer, load_tokenizer
from pretrain_cli.data.tokenizer_ids import qwen2_pipeline
from pretrain_cli.errors import UserError


def train_bpe(texts, vocab_size: int, special_tokens: list[str], min_frequency: int = 2, length: int | None = None,
              waiting=None):
    """Byte-level BPE: every byte is in the alphabet, so no text is ever unencodable. `waiting(seconds)` is called
    about every 0.1 s while the trainer works (`_interruptible`)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers, trainers

    tok = HFTokenizer(models.BPE())
    qwen2_pipeline(tok)
    # its own bars cannot follow ours: show_progress is fixed for the whole call (setting it from the iterator
    # raises "Already mutably borrowed"), and its reading bar would draw over the byte bar on the same line
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    _interruptible(lambda: tok.train_from_iterator(texts, trainer=trainer, length=length), waiting)
    return tok


def _interruptible(work, waiting=None) -> None:
    """Run `work` on a daemon thread while the main thread waits for it, so that a Ctrl-C ends the command at once.

    Why: the Rust BPE trainer runs its merges without returning to Python, where a signal handler could raise
    KeyboardInterrupt, and its reading of the iterator did not stop on one either: a Ctrl-C in `train-tokenizer`
    was answered only when the whole training had ended (7 s after the key on a 13 MB corpus; hours on a large one).
    It releases the GIL meanwhile, so the waiting main thread takes the KeyboardInterrupt as it comes; the thread,
    a daemon, ends with the process, before anything is written. The waiting thread is also the one that can say
    the merges are still going (`waiting`), since the trainer says nothing while it merges."""
    import threading
    import time

    failed = []

    def run():
        try:
            work()
        except BaseException as e:  # handed to the main thread, which raises it as the trainer's own
            failed.append(e)

    thread = threading.Thread(target=run, name="train-tokenizer", daemon=True)
    start = time.monotonic()
    thread.start()
    while thread.is_alive():
        thread.join(0.1)
        if waiting is not None and thread.is_alive():
            waiting(time.monotonic() - start)
    if failed:
        raise failed[0]


PROGRESS_EVERY = 30.0  # seconds between progress lines when stderr is not a terminal (a job's log)


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"{m}:{s:02d}"


class _Progress:
    """What train-tokenizer says while it reads and merges. Reading is counted in the unit the total is exact in:
    bytes of the files on disk against their sizes (`DocumentReader.on_disk`: compressed bytes for a compressed
    file, whose decompressed length only a full pass would tell; a .txt document is a paragraph, not a line: a bar
    of lines stopped at 9 % when reading ended), documents for a --max_doc_num sample. On a terminal a tqdm bar,
    and an elapsed-time line redrawn during the merges; in a log a line every PROGRESS_EVERY seconds. A line says
    when reading ends and the merges begin, which the trainer does without a word. `clock`: seconds (a test's)."""

    def __init__(self, reader, max_docs: int | None, vocab_size: int, clock=None):
        import time

        self.reader, self.vocab_size, self.tty = reader, vocab_size, sys.stderr.isatty()
        self.clock = clock or time.monotonic
        if max_docs is not None:
            self.unit, self.total = "doc", max_docs
        else:
            self.unit, self.total = "B", sum(f.stat().st_size for f in reader.files)
        self.start = self.next_line = self.clock()
        self.next_line += PROGRESS_EVERY
        self.bar = None
        if self.tty:
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, unit=self.unit, unit_scale=True, desc="train-tokenizer: reading",
                            file=sys.stderr)

    def _done(self) -> int:
        return self.reader.on_disk if self.unit == "B" else self.reader.documents

    def _amount(self, n: int) -> str:
        return f"{n / 1e6:,.1f} MB" if self.unit == "B" else f"{n:,}"

    def texts(self):
        shown = 0
        for text in self.reader:
            yield text
            now = self.clock()
            if self.bar is not None:
                done = self._done()
                self.bar.update(done - shown)
                shown = done
            elif now >= self.next_line:
                self.next_line = now + PROGRESS_EVERY
                done = self._done()
                print(f"train-tokenizer: read {self._amount(done)} of {self._amount(self.total)} "
                      f"({100 * done / max(1, self.total):.0f} %), {count(self.reader.documents, 'document', True)}, "
                      f"{_clock(now - self.start)} elapsed", file=sys.stderr, flush=True)
        self._reading_ended(self.clock())

    def _reading_ended(self, now: float) -> None:
        if self.unit == "doc":  # a --max_doc_num larger than the corpus: the documents there were
            self.total = min(self.total, self.reader.documents)
        if self.bar is not None:
            self.bar.total = self.total
            self.bar.update(self._done() - self.bar.n)
            self.bar.close()
        r = self.reader
        self.merge_start = self.next_line = now
        self.next_line += PROGRESS_EVERY
        print(f"train-tokenizer: read {count(r.documents, 'document', True)} ({r.bytes / 1e6:,.1f} MB) in "
              f"{_clock(now - self.start)}; training BPE on them (vocab {self.vocab_size}): the trainer reports no "
              f"progress while it merges; "
              + ("the elapsed time is shown" if self.tty else f"a line every {PROGRESS_EVERY:g} s says it is still "
                                                              "merging"), file=sys.stderr, flush=True)
        self.merging = True

    def waiting(self, _seconds: float) -> None:
        """Called while the trainer works: during the merges (after reading ended), the elapsed time."""
        if not getattr(self, "merging", False):
            return
        now = self.clock()
        if self.tty and now >= self.next_line:  # redrawn once a second
            self.next_line = now + 1.0
            print(f"\rtrain-tokenizer: merging, {_clock(now - self.merge_start)} elapsed", end="", file=sys.stderr,
                  flush=True)
        elif now >= self.next_line:
            self.next_line = now + PROGRESS_EVERY
            print(f"train-tokenizer: merging, {_clock(now - self.merge_start)} elapsed", file=sys.stderr, flush=True)

    def end(self) -> None:
        if self.tty and getattr(self, "merging", False):
            print(file=sys.stderr, flush=True)  # ends the redrawn line


def roles_by_position(special_tokens: list[str]) -> dict[str, str]:
    """`train-tokenizer --special_tokens PAD BOS EOS UNK [EXTRA...]`: the first four are the pad, bos, eos and unk
    tokens whatever their names (a name-based guess left `<p> <b> <e> <u>` without an EOS, which `preprocess
    --append_eos` then lacks); further ones are special tokens with no role, each kept whole by the tokenizer
    (`preprocess --special_tokens_in_text` decides what a document's text makes of them). Fewer than four, an empty
    or blank token, or one given twice (which the trainer would silently keep once) are refused."""
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
    from pretrain_cli.data.documents import DocumentReader

    _check_output_dir(Path(ns.output_dir))
    roles = roles_by_position(ns.special_tokens)
    min_vocab = 256 + len(ns.special_tokens)
    if ns.vocab_size < min_vocab:
        raise UserError(f"--vocab_size: {ns.vocab_size} is below the byte alphabet plus special tokens "
                        f"({min_vocab}); pass at least {min_vocab}")
    max_docs = ns.max_doc_num
    reader = DocumentReader(ns.input_path, ns.json_key, ns.skip_bad_lines, max_docs=max_docs,
                            note=lambda line: print(line, file=sys.stderr))
    progress = _Progress(reader, max_docs, ns.vocab_size)
    try:
        tok = train_bpe(progress.texts(), ns.vocab_size, list(ns.special_tokens), ns.min_frequency,
                        waiting=progress.waiting)
    finally:
        progress.end()
    if reader.documents == 0:
        raise UserError(f"--input_path: no non-empty documents in {' '.join(ns.input_path)}; check the files and "
                        "--json_key")
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
    # --max_doc_num takes the first documents in file order: said, with how far into the files that reached
    cap = f" (the first, from {reader.files_read} of {count(len(reader.files), 'file')})" if reader.exhausted else ""
    print(f"train-tokenizer: {count(reader.documents, 'document')}{cap} -> {out} (vocab {loaded.vocab_size}, "
          f"pad={roles['pad']} bos={roles['bos']} eos={roles['eos']} unk={roles['unk']}{extra}, fingerprint "
          f"{loaded.fingerprint[:12]})")
    if loaded.vocab_size < ns.vocab_size:  # the trainer ran out of frequent pairs: said, as a model sized to the
        lower = " or --min_frequency 1" if ns.min_frequency > 1 else ""  # number asked for would not match it
        print(f"note: --vocab_size {ns.vocab_size}: the corpus gave {loaded.vocab_size} tokens: every merge seen at "
              f"least --min_frequency {ns.min_frequency} times is learned; more text{lower} gives more",
              file=sys.stderr)
    if reader.bad_lines:
        print(f"train-tokenizer: skipped {reader.bad_lines} bad lines", file=sys.stderr)
    if reader.dropped_paragraphs:
        print(f"train-tokenizer: skipped {reader.dropped_note()}", file=sys.stderr)
    return 0
