"""Bad inputs (cases.py): tokenizers (missing, corrupt, too large for the model, without the special tokens a mode
needs) as `check`, `preprocess` and `train-tokenizer` read them."""
from __future__ import annotations

from case_run_json import DROP, cfg
from harness import make_tokenizer


def k_missing_dir(d):
    return cfg(d, tokenizer_name_or_path="tok_missing"), ["tokenizer_name_or_path", "tok_missing"]
def k_no_tokenizer_json(d):
    (d / "tok" / "tokenizer.json").unlink()
    return cfg(d), ["tokenizer_name_or_path", "tok", "no tokenizer.json"]
def k_corrupt_tokenizer_json(d):
    (d / "tok" / "tokenizer.json").write_text('{"version": "1.0", "model": ')
    return cfg(d), ["tok/tokenizer.json", "cannot be loaded"]
def k_bad_tokenizer_config(d):
    (d / "tok" / "tokenizer_config.json").write_text("{bad json")
    return cfg(d), ["tok/tokenizer_config.json", "invalid JSON"]
def k_vocab_too_large(d):
    make_tokenizer(d / "big", vocab_size=600, pad_to=600)
    return cfg(d, tokenizer_name_or_path="big"), ["tokenizer_name_or_path", "600 tokens", "vocab_size is 512"]
def k_padded_missing_specials(d):
    make_tokenizer(d / "nospecial", specials=["[UNK]"])
    return cfg(d, tokenizer_name_or_path="nospecial", sample_mode="padded"), ["nospecial", "no bos token", "padded"]
def k_padded_without_tokenizer(d):
    return cfg(d, tokenizer_name_or_path=DROP, sample_mode="padded"), ["sample_mode 'padded' needs a tokenizer"]
def k_preprocess_missing_tokenizer(d):
    return (["preprocess", "--input_path", "corpus.jsonl", "--output_prefix", "out/x", "--tokenizer", "nope"],
            ["nope", "tokenizer directory not found"])
def k_preprocess_no_eos(d):
    make_tokenizer(d / "noeos", specials=["[UNK]"])
    return (["preprocess", "--input_path", "corpus.jsonl", "--output_prefix", "out/x", "--tokenizer", "noeos",
             "--append_eos"], ["noeos", "no EOS token"])
def k_train_tokenizer_tiny_vocab(d):
    return (["train-tokenizer", "--input_path", "corpus.jsonl", "--output_dir", "out/tok", "--vocab_size", "10"],
            ["--vocab_size", "at least 260"])
