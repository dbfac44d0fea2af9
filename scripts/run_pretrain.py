#!/usr/bin/env python
"""PaddleNLP-style entry: `python scripts/run_pretrain.py config.json [--key value ...]`.

The same as `pretrain-cli train config.json ...`; a script path because
`python -m paddle.distributed.launch` takes one.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from pretrain_cli.cli import main  # noqa: E402

if __name__ == "__main__":
    # its usage line and errors name this script as the user ran it, not `pretrain-cli train`
    raise SystemExit(main(["train", *sys.argv[1:]], prog=f"python {sys.argv[0]}"))
