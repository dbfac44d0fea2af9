"""Bad inputs (cases.py): shell syntax and code in argument values, which must be taken literally (named in the
error as written, nothing run: no `pwned` file)."""
from __future__ import annotations

from case_run_json import cfg


def s_config_code_string(d):
    return cfg(d, split="__import__('os').system('touch pwned')"), ["split"]
def s_shell_vars_in_input_dir(d):
    return cfg(d, input_dir="$HOME/data"), ["input_dir: $HOME/data", "no token files"]
def s_tilde_model(d):
    return cfg(d, model_name_or_path="~x/model"), ["~x/model", "not shell-expanded"]
def s_backticks_tokenizer(d):
    return cfg(d, tokenizer_name_or_path="`touch pwned`"), ["`touch pwned`"]
def s_subshell_data(d):
    return cfg(d, input_dir="$(touch pwned)"), ["'$(touch pwned)' does not exist"]
