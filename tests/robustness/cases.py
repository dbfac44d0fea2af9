"""The bad inputs: each builder mutates a fresh copy of the assets and returns the CLI call.

A builder gets `d` (a case directory holding tok/, data/, corpus.jsonl, run.json and, for
checkpoint cases, ckpt/ = a complete checkpoint-9 of the reference run) and returns
(argv, expected substrings of the error line[, env]). The CLI runs with cwd = d.
`FAST` cases fail before Paddle is imported (one subprocess each); `PADDLE` cases fail after
the model is built (all run inside one batch process, see batch_cli.py).

The builders, by kind of input: cases_arguments.py (a_: argument files, command lines, models),
cases_token_files.py (t_), cases_tokenizers.py (k_), cases_corpus.py (j_: input to preprocess),
cases_literal_values.py (s_: shell syntax and code taken literally), cases_checkpoints.py (`PADDLE`);
case_run_json.py writes the argument file they share.
"""
from __future__ import annotations

import cases_arguments
import cases_corpus
import cases_literal_values
import cases_token_files
import cases_tokenizers
from cases_checkpoints import PADDLE  # noqa: F401 (test_bad_inputs.py reads cases.PADDLE)

KINDS = (cases_arguments, cases_token_files, cases_tokenizers, cases_corpus, cases_literal_values)
FAST = {name: fn for module in KINDS for name, fn in vars(module).items()
        if callable(fn) and name[:2] in ("a_", "t_", "k_", "j_", "s_") and name not in ("j_output_clash",)}

# These need tokenizer "small" (vocab 270) built by the test setup for t_inspect_vocab.
SMALL_TOKENIZER_CASES = {"t_inspect_vocab"}
