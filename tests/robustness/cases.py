"""The bad inputs: each builder mutates a fresh copy of the assets and returns the CLI call.

A builder gets `d` (a case directory holding tok/, data/, corpus.jsonl, run.json and, for
checkpoint cases, ckpt/ = a complete checkpoint-9 of the reference run) and returns
(argv, expected substrings of the error line[, env]). The CLI runs with cwd = d.
`FAST` cases fail before Paddle is imported (one subprocess each); `PADDLE` cases fail after
the model is built (all run inside one batch process, see batch_cli.py).
"""
from __future__ import annotations

import json
import pickle
import struct
from pathlib import Path

import numpy as np

from harness import RUN_CONFIG, make_tokenizer, write_jsonl

CHECK = ["check", "run.json"]


def cfg(d: Path, **changes) -> list[str]:
    c = dict(RUN_CONFIG)
    for k, v in changes.items():
        if v is DROP:
            c.pop(k, None)
        else:
            c[k] = v
    (d / "run.json").write_text(json.dumps(c))
    return CHECK


DROP = object()


def raw(d: Path, text: str, name: str = "run.json") -> list[str]:
    (d / name).write_text(text)
    return ["check", name]


def idx_patch(d: Path, offset: int, data: bytes) -> None:
    p = d / "data" / "c.idx"
    b = bytearray(p.read_bytes())
    b[offset: offset + len(data)] = data
    p.write_bytes(bytes(b))


def idx_header(d: Path):
    b = (d / "data" / "c.idx").read_bytes()
    n, dd = struct.unpack("<QQ", b[18:34])
    return n, dd


# ------------------------------------------------------------------------ argument files
def a_syntax(d):
    return raw(d, '{"max_steps": 10,}'), ["run.json:1:", "invalid JSON"]
def a_unknown_key(d):
    return cfg(d, max_seq_lenght=32), ["unknown key `max_seq_lenght`", "did you mean `max_seq_length`"]
def a_type_str_for_int(d):
    return cfg(d, max_steps="ten"), ["`max_steps` expects int", "'ten'"]
def a_type_object(d):
    return cfg(d, learning_rate={"value": 1}), ["`learning_rate` expects float", "object"]
def a_type_list_for_scalar(d):
    return cfg(d, seed=[1, 2]), ["`seed` expects int", "list"]
def a_type_bool(d):
    return cfg(d, do_train="maybe"), ["`do_train` expects bool"]
def a_negative_batch(d):
    return cfg(d, per_device_train_batch_size=-4), ["per_device_train_batch_size", ">= 1", "-4"]
def a_zero_accumulation(d):
    return cfg(d, gradient_accumulation_steps=0), ["gradient_accumulation_steps", ">= 1"]
def a_seq_len_one(d):
    return cfg(d, max_seq_length=1), ["max_seq_length", ">= 2"]
def a_huge_float(d):
    return cfg(d, max_steps=1e30), ["max_steps", "out of range"]
def a_huge_int(d):
    return raw(d, json.dumps({**RUN_CONFIG, "save_steps": 0}).replace('"save_steps": 0', '"save_steps": ' + "9" * 400)), ["save_steps", "out of range"]
def a_nan(d):
    return raw(d, json.dumps({**RUN_CONFIG, "learning_rate": float("nan")})), ["learning_rate", "finite"]
def a_inf_weight_decay(d):
    return raw(d, json.dumps({**RUN_CONFIG, "weight_decay": float("inf")})), ["weight_decay", "finite"]
def a_fp16_and_bf16(d):
    return cfg(d, fp16=True, bf16=True), ["fp16, bf16", "choose one"]
def a_min_lr_above_lr(d):
    return cfg(d, min_learning_rate=0.1), ["min_learning_rate", "above learning_rate"]
def a_decay_before_warmup(d):
    return cfg(d, warmup_steps=8, decay_steps=4), ["decay_steps", "warmup"]
def a_beta_range(d):
    return cfg(d, adam_beta1=1.5), ["adam_beta1", "[0, 1)"]
def a_spike_policy_choice(d):
    return cfg(d, spike_policy="retry"), ["spike_policy", "retry"]
def a_spike_factor_at_most_one(d):
    return cfg(d, spike_loss_factor=1.0), ["spike_loss_factor", "0 (off) or a finite factor > 1"]
def a_spike_window_zero(d):
    return cfg(d, spike_policy="skip", spike_window=0), ["spike_window", ">= 1"]
def a_warmup_ratio(d):
    return cfg(d, warmup_ratio=2.0), ["warmup_ratio", "[0, 1]"]
def a_seed_negative(d):
    return cfg(d, seed=-1), ["seed", "[0, 2^32)"]
def a_nothing_to_do(d):
    return cfg(d, do_train=False, do_eval=False), ["nothing to do"]
def a_zero_max_steps(d):
    return cfg(d, max_steps=0), ["max_steps", "> 0"]
def a_no_output_dir(d):
    return cfg(d, output_dir=DROP), ["output_dir", "required"]
def a_missing_file(d):
    return ["check", "nope.json"], ["nope.json", "not found"]
def a_empty_file(d):
    return raw(d, ""), ["run.json", "empty"]
def a_whitespace_file(d):
    return raw(d, "\n  \n"), ["run.json", "empty"]
def a_not_object(d):
    return raw(d, "[1, 2, 3]"), ["run.json", "JSON object", "list"]
def a_json_string(d):
    return raw(d, '"max_steps=10"'), ["run.json", "JSON object", "str"]
def a_not_json_suffix(d):
    (d / "run.toml").write_text("max_steps = 10\n")
    return ["check", "run.toml"], ["run.toml", "must be a .json file (PaddleNLP's) or a .yaml/.yml file"]
def a_yaml_key_twice(d):
    (d / "run.yaml").write_text("max_steps: 10\nseed: 1\nmax_steps: 20\n")
    return ["check", "run.yaml"], ["run.yaml:3:", "`max_steps` appears more than once"]
def a_yaml_syntax_error(d):
    (d / "run.yml").write_text("max_steps: 10\nseed: [1,\n")
    return ["check", "run.yml"], ["run.yml:3:1:", "invalid YAML"]
def a_not_utf8(d):
    (d / "run.json").write_bytes(b'{"output_dir": "\xff\xfe"}')
    return CHECK, ["run.json", "cannot read"]
def a_directory_as_file(d):
    (d / "dir.json").mkdir()
    return ["check", "dir.json"], ["dir.json", "not found"]
def a_choice(d):
    return cfg(d, lr_scheduler_type="exponential"), ["lr_scheduler_type", "must be one of"]
def a_sharding_option(d):
    return cfg(d, sharding="stage9"), ["sharding", "stage9"]
def a_sharding_offload_stage1(d):
    return cfg(d, sharding="stage1 offload"), ["sharding", "offload"]
def a_tp_not_dividing_kv_heads(d):  # micro-qwen2: 4 heads, 2 KV heads
    return cfg(d, tensor_parallel_degree=4), ["tensor_parallel_degree: 4", "num_key_value_heads"], {"PADDLE_TRAINERS_NUM": "4"}
def a_tp_not_dividing_world(d):
    return cfg(d, tensor_parallel_degree=2), ["tensor_parallel_degree: 2", "world size 3"], {"PADDLE_TRAINERS_NUM": "3"}
def a_sequence_parallel_with_zero3(d):
    return (cfg(d, tensor_parallel_degree=2, sequence_parallel=True, sharding="stage3"),
            ["sequence_parallel", "not supported with sharding: stage3"], {"PADDLE_TRAINERS_NUM": "4"})
def a_partial_sharding_degree_stage3(d):
    return (cfg(d, sharding="stage3", sharding_parallel_degree=2), ["sharding_parallel_degree: 2", "stage1"],
            {"PADDLE_TRAINERS_NUM": "4"})
def a_pp_multi_process(d):
    return cfg(d, pipeline_parallel_degree=4), ["pipeline_parallel_degree: 4 stages for 2 decoder layers"], {"PADDLE_TRAINERS_NUM": "4"}
def a_override_unknown(d):
    cfg(d)
    return CHECK + ["--max_sep", "5"], ["command line", "unknown key `max_sep`"]
def a_override_bad_int(d):
    cfg(d)
    return CHECK + ["--seed", "abc"], ["command line", "`seed` expects int", "'abc'"]
def a_override_missing_value(d):
    cfg(d)
    return CHECK + ["--max_steps"], ["--max_steps needs a value"]
def a_override_two_values(d):
    cfg(d)
    return CHECK + ["--max_steps", "3", "4"], ["--max_steps takes one value"]
def a_unknown_command(d):
    return ["trian", "run.json"], ["unknown command 'trian'", "did you mean `train`"]
def a_split_words(d):
    return cfg(d, split="most,some"), ["split", "'most,some'"]
def a_split_zero(d):
    return cfg(d, split="0,0,0"), ["split", "positive sum"]
def a_split_empty_phase(d):
    return cfg(d, split="100,0,0", do_eval=True), ["split", "valid", "do_eval"]
def a_missing_model(d):
    return cfg(d, model_name_or_path="Qwen/Qwen9-70B"), ["model_name_or_path", "Qwen/Qwen9-70B", "nothing is downloaded"]
def a_model_dir_no_config(d):
    (d / "m").mkdir()
    return cfg(d, model_name_or_path="m"), ["model_name_or_path", "has no config.json"]
def a_model_config_bad_json(d):
    (d / "m").mkdir()
    (d / "m" / "config.json").write_text('{"model_type": "qwen2",')
    return cfg(d, model_name_or_path="m"), ["m/config.json", "JSON"]
def a_model_type(d):
    (d / "m").mkdir()
    (d / "m" / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 512}))
    return cfg(d, model_name_or_path="m"), ["model_type 'gpt2'", "llama, qwen2"]
def a_model_heads(d):
    c = json.loads((Path(__file__).parents[2] / "src/pretrain_cli/config/presets/micro-qwen2/config.json").read_text())
    c["num_key_value_heads"] = 3
    (d / "m").mkdir()
    (d / "m" / "config.json").write_text(json.dumps(c))
    return cfg(d, model_name_or_path="m"), ["m/config.json"]
def a_continue_without_weights(d):
    return cfg(d, continue_training=True), ["micro-qwen2", "safetensors"]
def a_layers_zero(d):
    return cfg(d, num_hidden_layers=0), ["num_hidden_layers", ">= 1"]


# ------------------------------------------------------------------------ token files
def t_missing_prefix(d):
    return cfg(d, input_dir="data/nothere"), ["data/nothere", "no token files"]
def t_empty_dir(d):
    (d / "empty").mkdir()
    return cfg(d, input_dir="empty"), ["input_dir", "empty", "no .idx"]
def t_wrong_magic(d):
    idx_patch(d, 0, b"NOTANIDX\x00")
    return cfg(d), ["data/c.idx", "wrong magic"]
def t_wrong_version(d):
    idx_patch(d, 9, struct.pack("<Q", 2))
    return cfg(d), ["data/c.idx", "version 2"]
def t_dtype_code(d):
    idx_patch(d, 17, bytes([42]))
    return cfg(d), ["data/c.idx", "dtype code 42"]
def t_truncated_idx(d):
    p = d / "data" / "c.idx"
    p.write_bytes(p.read_bytes()[:-100])
    return cfg(d), ["data/c.idx", "truncated"]
def t_header_only(d):
    p = d / "data" / "c.idx"
    p.write_bytes(p.read_bytes()[:20])
    return cfg(d), ["data/c.idx", "34-byte header"]
def t_short_bin(d):
    p = d / "data" / "c.bin"
    p.write_bytes(p.read_bytes()[:-64])
    return cfg(d), ["data/c.bin", "truncated or mismatched"]
def t_missing_bin(d):
    (d / "data" / "c.bin").unlink()
    return cfg(d), ["data/c.bin", "missing"]
def t_decreasing_pointers(d):
    n, _ = idx_header(d)
    off = 34 + 4 * n + 8 * 5  # pointer of sequence 5
    idx_patch(d, off, struct.pack("<q", 2))
    return cfg(d), ["data/c.idx", "decreasing pointer at sequence 5"]
def t_doc_idx_end(d):
    n, dd = idx_header(d)
    idx_patch(d, 34 + 12 * n + 8 * (dd - 1), struct.pack("<q", n + 7))
    return cfg(d), ["data/c.idx", "doc_idx"]
def t_ids_above_vocab(d):
    p = d / "data" / "c.bin"
    a = np.fromfile(p, np.uint16)
    a[100] = 600
    a.tofile(p)
    (d / "data" / "c.json").unlink()  # the sidecar's max_token_id would be stale
    return cfg(d), ["data/c.bin", "max token id 600", "vocab_size 512"]
def t_zero_documents(d):
    with open(d / "data" / "c.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, 0, 1) + struct.pack("<q", 0))
    (d / "data" / "c.bin").write_bytes(b"")
    return cfg(d), ["data/c.idx", "zero documents"]
def t_split_rounds_to_zero(d):
    return cfg(d, split="9990,1,0", do_eval=True), ["valid split", "rounds to 0"]
def t_lsm_size(d):
    (d / "data" / "c.lsm").write_bytes(b"\x01" * 10)
    return cfg(d), ["data/c.lsm", "one byte per token"]
def t_legacy_pickle(d):
    arr = np.array([{"a": 1}, None], dtype=object)
    with open(d / "data" / "c_ids.npy", "wb") as f:
        np.save(f, arr, allow_pickle=True)
    np.savez(d / "data" / "c_idx.npz", lens=np.array([2]), docs=np.array([0, 1]))
    return cfg(d), ["data/c_ids.npy", "unreadable legacy", "Python objects"]
def t_blend_negative_weight(d):
    return cfg(d, input_dir="-1 data/c"), ["input_dir", "must be positive"]
def t_blend_odd(d):
    return cfg(d, input_dir="0.5 data/c 0.5"), ["input_dir", "weight/prefix pairs"]
def t_seq_longer_than_data(d):
    # a one-document corpus far shorter than max_seq_length
    tok = [1, 2, 3, 4, 5]
    with open(d / "data" / "c.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, 1, 2))
        f.write(struct.pack("<i", len(tok)) + struct.pack("<q", 0) + struct.pack("<qq", 0, 1))
    np.array(tok, np.uint16).tofile(d / "data" / "c.bin")
    (d / "data" / "c.json").unlink()
    return cfg(d, split="1"), ["data/c", "fewer than one sample"]
def t_inspect_vocab(d):
    return ["inspect-data", "data/c", "--tokenizer", "small"], ["data/c.bin", "max token id", "vocab size 270"]
def t_inspect_step_zero(d):
    return ["inspect-data", "data/c", "--step", "0", "--max_seq_length", "32"], ["--step", ">= 1"]
def t_inspect_missing(d):
    return ["inspect-data", "data/zzz"], ["data/zzz", "no token files"]
def t_eval_data_missing(d):
    return ["eval", "--model", "micro-qwen2", "--data", "data/zzz", "--max_seq_length", "32"], ["data/zzz", "no token files"]
def t_eval_short_data(d):
    return ["eval", "--model", "micro-qwen2", "--data", "data/c", "--max_seq_length", "10000000"], ["--data", "fewer than one window"]
def t_eval_seq_zero(d):
    return ["eval", "--model", "micro-qwen2", "--data", "data/c", "--max_seq_length", "0"], ["--max_seq_length", ">= 1"]
def t_eval_ids_above_vocab(d):
    t_ids_above_vocab(d)
    return ["eval", "--model", "micro-qwen2", "--data", "data/c", "--max_seq_length", "32"], ["token id 600", "512"]
def t_eval_missing_model(d):
    return ["eval", "--model", "nomodel", "--data", "data/c", "--max_seq_length", "32"], ["--model", "nomodel"]


# ------------------------------------------------------------------------ tokenizers
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
    return cfg(d), ["tok/tokenizer_config.json", "not valid JSON"]
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


# ------------------------------------------------------------------------ jsonl input to preprocess
def _pre(src: str, *extra) -> list[str]:
    return ["preprocess", "--input_path", src, "--output_prefix", "out/x", "--tokenizer", "tok", *extra]
def j_bad_json_line(d):
    (d / "in.jsonl").write_text('{"text": "fine"}\n{"text": "broken\n{"text": "fine"}\n')
    return _pre("in.jsonl"), ["in.jsonl:2:", "not valid JSON", "--skip_bad_lines"]
def j_missing_key(d):
    (d / "in.jsonl").write_text('{"text": "fine"}\n{"text": "fine"}\n{"body": "x"}\n')
    return _pre("in.jsonl"), ["in.jsonl:3:", "no string field 'text'", "--json_key"]
def j_non_string_text(d):
    (d / "in.jsonl").write_text('{"text": 5}\n')
    return _pre("in.jsonl"), ["in.jsonl:1:", "no string field"]
def j_not_utf8(d):
    (d / "in.jsonl").write_bytes(b'{"text": "fine"}\n{"text": "\xff\xfe"}\n')
    return _pre("in.jsonl"), ["in.jsonl", "not UTF-8"]
def j_all_empty(d):
    (d / "in.jsonl").write_text('{"text": ""}\n{"text": "   "}\n')
    return _pre("in.jsonl"), ["no non-empty documents"]
def j_missing_input(d):
    return _pre("nothere.jsonl"), ["nothere.jsonl", "input path not found"]
def j_no_text_files(d):
    (d / "bin_only").mkdir()
    (d / "bin_only" / "a.csv").write_bytes(b"PAR1")
    return _pre("bin_only"), ["no .jsonl/.json/.txt", ".parquet files"]
def j_corrupt_parquet(d):
    (d / "in.parquet").write_bytes(b"PAR1 not really")
    return _pre("in.parquet"), ["in.parquet", "not a readable Parquet file", "--skip_bad_lines"]
def j_truncated_gzip(d):
    import gzip

    (d / "in.jsonl.gz").write_bytes(gzip.compress(b'{"text": "fine"}\n' * 50)[:-12])
    return _pre("in.jsonl.gz"), ["in.jsonl.gz: line", "corrupt or truncated .gz data", "--skip_bad_lines"]
def j_output_clash(d):
    return ["preprocess", "--input_path", "in.json", "--output_prefix", "in", "--tokenizer", "tok"], ["would overwrite the input"]
def j_output_clash_setup(d):
    (d / "in.json").write_text('{"text": "hello"}\n')
    return j_output_clash(d)
def j_train_tokenizer_bad_line(d):
    (d / "in.jsonl").write_text('{"text": "fine"}\n[not json\n')
    return (["train-tokenizer", "--input_path", "in.jsonl", "--output_dir", "out/tok", "--vocab_size", "300"],
            ["in.jsonl:2:", "not valid JSON"])


# ------------------------------------------------------------------------ security / literal paths
def s_config_code_string(d):
    return cfg(d, split="__import__('os').system('touch pwned')"), ["split"]
def s_shell_vars_in_input_dir(d):
    return cfg(d, input_dir="$HOME/data"), ["$HOME/data", "no token files"]
def s_tilde_model(d):
    return cfg(d, model_name_or_path="~x/model"), ["~x/model", "not shell-expanded"]
def s_backticks_tokenizer(d):
    return cfg(d, tokenizer_name_or_path="`touch pwned`"), ["`touch pwned`"]
def s_subshell_data(d):
    return cfg(d, input_dir="$(touch pwned)"), ["'$(touch'"]


FAST = {name[0:]: fn for name, fn in list(globals().items())
        if callable(fn) and name[:2] in ("a_", "t_", "k_", "j_", "s_") and name not in ("j_output_clash",)}

# These need tokenizer "small" (vocab 270) built by the test setup for t_inspect_vocab.
SMALL_TOKENIZER_CASES = {"t_inspect_vocab"}


# ------------------------------------------------------------------------ checkpoints (need Paddle)
def _resume(d, **extra):
    cfg(d, **{"resume_from_checkpoint": "ckpt", "output_dir": "out", **extra})
    return ["train", "run.json"]


def _eval(d):
    return ["eval", "--model", "ckpt", "--data", "data/c", "--max_seq_length", "32", "--max_batches", "1"]


def _tensors(d):
    from safetensors.numpy import load_file

    return dict(load_file(str(d / "ckpt" / "model.safetensors")))


def _save(d, tensors, name="model.safetensors"):
    from safetensors.numpy import save_file

    p = d / "ckpt" / name
    p.unlink()
    save_file(tensors, str(p), metadata={"format": "pt"})


def c_missing_shard(d):
    t = _tensors(d)
    names = sorted(t)
    half = {n: t[n] for n in names[: len(names) // 2]}
    _save(d, half)
    (d / "ckpt" / "model.safetensors").rename(d / "ckpt" / "model-00001-of-00002.safetensors")
    wm = {n: ("model-00001-of-00002.safetensors" if n in half else "model-00002-of-00002.safetensors") for n in names}
    (d / "ckpt" / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    return ["model-00002-of-00002.safetensors", "missing"]
def c_shape_mismatch(d):
    t = _tensors(d)
    t["model.norm.weight"] = np.ones(7, np.float32)
    _save(d, t)
    return ["model.norm.weight", "shape [7]"]
def c_wrong_dtype(d):
    t = _tensors(d)
    t["model.norm.weight"] = np.ones(t["model.norm.weight"].shape, np.int32)
    _save(d, t)
    return ["model.norm.weight", "int32"]
def c_truncated_weights(d):
    p = d / "ckpt" / "model.safetensors"
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    return ["model.safetensors", "resume from another checkpoint"]
def c_garbage_header(d):
    (d / "ckpt" / "model.safetensors").write_bytes(b"\xff" * 64)
    return ["model.safetensors"]
def c_missing_tensor(d):
    t = _tensors(d)
    del t["model.layers.1.mlp.up_proj.weight"]
    _save(d, t)
    return ["model.layers.1.mlp.up_proj.weight", "missing"]
def c_bad_index_json(d):
    (d / "ckpt" / "model.safetensors.index.json").write_text("{not json")
    return ["model.safetensors.index.json"]
def c_other_architecture(d):
    c = json.loads((d / "ckpt" / "config.json").read_text())
    c.update(hidden_size=128, intermediate_size=256)
    (d / "ckpt" / "config.json").write_text(json.dumps(c))
    return ["hidden_size"]
def c_other_family(d):
    c = json.loads((d / "ckpt" / "config.json").read_text())
    c.update(model_type="llama", architectures=["LlamaForCausalLM"])
    (d / "ckpt" / "config.json").write_text(json.dumps(c))
    return ["llama"]


def r_no_trainer_state(d):
    (d / "ckpt" / "trainer_state.json").unlink()
    return _resume(d), ["ckpt", "no trainer_state.json"]
def r_bad_trainer_state(d):
    (d / "ckpt" / "trainer_state.json").write_text('{"global_step": "nine"}')
    return _resume(d), ["trainer_state.json", "global_step"]
def r_missing_optimizer(d):
    (d / "ckpt" / "optimizer.safetensors").unlink()
    return _resume(d), ["optimizer.safetensors"]
def r_truncated_optimizer(d):
    p = d / "ckpt" / "optimizer.safetensors"
    p.write_bytes(p.read_bytes()[:1000])
    return _resume(d), ["resume_from_checkpoint", "optimizer.safetensors has 1000 bytes, the index says"]
def r_other_seq_len(d):
    return _resume(d, max_seq_length=64), ["max_seq_length=32", "64"]
def r_flipped_byte(d):
    p = d / "ckpt" / "model.safetensors"
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 1
    p.write_bytes(bytes(data))
    return _resume(d), ["resume_from_checkpoint", "model.safetensors does not match its checksum"]
def r_not_a_dir(d):
    return _resume(d, resume_from_checkpoint="ckpt/config.json"), ["resume_from_checkpoint", "not a directory"]


PADDLE = {}
for _name, _fn in list(globals().items()):
    if _name.startswith("c_") and callable(_fn):
        def _mk_resume(fn):
            return lambda d: (_resume(d), fn(d))
        def _mk_eval(fn):
            return lambda d: (_eval(d), fn(d))
        PADDLE["resume_" + _name[2:]] = _mk_resume(_fn)
        # a named checkpoint is verified against its index before anything loads (storage.intact): a weights file
        # rewritten since the save no longer has the size (or checksum) the index lists (the rewrite drops the
        # record of its pieces the save put in its header: shorter)
        RESUME_EXPECT_OVERRIDE = {"missing_shard": "model.safetensors is missing", "shape_mismatch": "the index says",
                                  "wrong_dtype": "the index says",
                                  "truncated_weights": "the index says",
                                  "garbage_header": "the index says", "missing_tensor": "the index says"}
        if _name[2:] in RESUME_EXPECT_OVERRIDE:
            PADDLE["resume_" + _name[2:]] = (lambda fn, exp: (lambda d: (_resume(d), (fn(d), exp)[1])))(
                _fn, ["resume_from_checkpoint", "model.safetensors", RESUME_EXPECT_OVERRIDE[_name[2:]]])
        PADDLE["eval_" + _name[2:]] = _mk_eval(_fn)
        # eval reads a checkpoint of ours as a resume does (`training.weight_source.load_weights`): its files are
        # checked against its index first, so a rewritten weights file is named by its size
        EVAL_EXPECT_OVERRIDE = {"other_architecture": ["ckpt", "shape"], "other_family": ["ckpt", "unexpected tensor"],
                                **{k: ["model.safetensors", v] for k, v in RESUME_EXPECT_OVERRIDE.items()}}
        if _name[2:] in EVAL_EXPECT_OVERRIDE:
            PADDLE["eval_" + _name[2:]] = (lambda fn, exp: (lambda d: (_eval(d), (fn(d), exp)[1])))(
                _fn, EVAL_EXPECT_OVERRIDE[_name[2:]])
    elif _name.startswith("r_") and callable(_fn):
        PADDLE["resume_" + _name[2:]] = _fn
