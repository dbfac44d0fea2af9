"""KV-cache generation: equals the uncached loop token for token, is seeded, and matches HF greedy.

Tiny random models (std 0.2 init so logits are well separated and greedy has no near-ties).
"""
import json

import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

from pretrain_cli.models import build_model  # noqa: E402
from pretrain_cli.models.config import ModelConfig  # noqa: E402
from pretrain_cli.models import generation  # noqa: E402
from pretrain_cli.models.generation import generate  # noqa: E402


def _model(model_type="llama", **kw):
    cfg = ModelConfig(**{**dict(model_type=model_type, vocab_size=97, hidden_size=32, intermediate_size=48,
                                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                max_position_embeddings=64, initializer_range=0.2), **kw})
    paddle.seed(0)
    model = build_model(cfg)
    for name, p in model.named_parameters():  # non-zero biases and q/k norms exercise the cached path with them
        if name.endswith("bias") or "_norm." in name:
            p.set_value(p + paddle.randn(p.shape) * 0.2)
    return model, cfg


def _prompt(bsz=2, n=5, seed=1):
    return np.random.default_rng(seed).integers(0, 97, (bsz, n)).astype("int64")


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3"])
def test_cached_greedy_equals_uncached(model_type):
    model, _ = _model(model_type, tie_word_embeddings=model_type != "llama",
                      **({"head_dim": 12} if model_type == "qwen3" else {}))
    ids = _prompt()
    cached = generate(model, ids, 12)
    uncached = generate(model, ids, 12, use_cache=False)
    assert cached.shape == (2, 17)
    np.testing.assert_array_equal(cached, uncached)


def test_cached_logits_match_full_forward():
    model, _ = _model()
    ids = paddle.to_tensor(_prompt(n=9))
    model.eval()
    with paddle.no_grad():
        full = model(ids).numpy()  # [2, 9, vocab]
        cache = model.new_cache()
        parts = [model(ids[:, :6], cache).numpy()] + [model(ids[:, t:t + 1], cache).numpy() for t in range(6, 9)]
    np.testing.assert_allclose(np.concatenate(parts, axis=1), full, atol=1e-5)
    assert cache.offset == 9


def test_sliding_window_and_eos_agree_with_uncached():
    model, _ = _model()
    ids = _prompt(n=6)
    kw = dict(max_length=8)
    np.testing.assert_array_equal(generate(model, ids, 10, **kw), generate(model, ids, 10, use_cache=False, **kw))
    first = generate(model, ids, 3)[:, 6:]  # pick a token the model actually emits as "eos"
    eos = int(first[0, 1])
    a = generate(model, ids, 10, eos_token_id=eos)
    np.testing.assert_array_equal(a, generate(model, ids, 10, eos_token_id=eos, use_cache=False))
    row = a[0, 6:]
    hit = int(np.argmax(row == eos))
    assert (row[hit:] == eos).all()


def test_seeded_sampling_is_reproducible():
    model, _ = _model()
    ids = _prompt()
    kw = dict(temperature=0.8, top_k=20, top_p=0.9)
    a = generate(model, ids, 10, seed=7, **kw)
    np.testing.assert_array_equal(a, generate(model, ids, 10, seed=7, **kw))
    np.testing.assert_array_equal(a, generate(model, ids, 10, seed=7, use_cache=False, **kw))
    assert not np.array_equal(a, generate(model, ids, 10, seed=8, **kw))


MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, norm_topk_prob=True)


MLA = dict(num_key_value_heads=4, kv_lora_rank=12, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6,
           num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, n_shared_experts=1, first_k_dense_replace=1)


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "deepseek_v2",
                                        "deepseek_v3"])
def test_greedy_matches_hf_generate(model_type, tmp_path):
    import torch
    import transformers
    from pretrain_cli.models import convert

    extra = {"qwen3": {"head_dim": 12},  # MoE: the routing and the shared expert see one new token per step
             "qwen2_moe": {**MOE, "shared_expert_intermediate_size": 24}, "qwen3_moe": {**MOE, "head_dim": 12},
             # MLA's latent K/V cached expanded; V2-Lite's one q_proj, V3's low-rank q, its sigmoid routing with a
             # balancing bias (perturbed like every bias) and an MTP module that generation does not run
             "deepseek_v2": {**MLA, "q_lora_rank": None, "topk_method": "greedy", "routed_scaling_factor": 1.5},
             "deepseek_v3": {**MLA, "q_lora_rank": 10, "topk_method": "noaux_tc", "n_group": 2, "topk_group": 1,
                             "norm_topk_prob": True, "routed_scaling_factor": 2.5,
                             "num_nextn_predict_layers": 1}}.get(model_type, {})
    model, cfg = _model(model_type, rope_theta=5e4, **extra)
    convert.save_hf(model, cfg, str(tmp_path))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), torch_dtype=torch.float32).eval()
    ids = _prompt()
    with torch.no_grad():
        want = hf.generate(torch.from_numpy(ids), attention_mask=torch.ones(ids.shape, dtype=torch.long),
                           do_sample=False, max_new_tokens=10, min_new_tokens=10, eos_token_id=None,
                           pad_token_id=0).numpy()
    np.testing.assert_array_equal(generate(model, ids, 10), want)


def test_generate_help_names_the_key_value_overrides():
    from pretrain_cli.cli import build_parser

    text = build_parser("generate")[0].format_help()
    assert "[--key value ...]" in text and "applied to the settings of the run that wrote --model" in " ".join(text.split())


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A 16-position model directory with a tokenizer of its vocabulary: prompts outgrow its context quickly."""
    from data_helpers import make_tokenizer
    from pretrain_cli.models import convert

    d = tmp_path_factory.mktemp("gen")
    make_tokenizer(d)
    from pretrain_cli.data.tokenizer import load_tokenizer

    cfg = ModelConfig(model_type="llama", vocab_size=load_tokenizer(str(d)).vocab_size, hidden_size=16,
                      intermediate_size=24, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                      max_position_embeddings=16)
    paddle.seed(0)
    convert.save_hf(build_model(cfg), cfg, str(d))
    return str(d)


def _cli(capsys, *argv):
    from pretrain_cli.cli import main as cli_main

    code = cli_main(["generate", *argv])
    return code, capsys.readouterr()


def test_first_slid_token_counts_the_context_each_token_was_predicted_from():
    # token j is predicted from prompt + j - 1 tokens; the window slides once that exceeds the limit
    assert generation.first_slid_token(10, 8, 16) == 8 and generation.first_slid_token(10, 7, 16) is None
    assert generation.first_slid_token(16, 1, 16) is None and generation.first_slid_token(16, 2, 16) == 2
    assert generation.first_slid_token(40, 1, 16) == 1


def test_a_context_beyond_max_position_embeddings_is_said(model_dir, capsys):
    """The window the model sees slides to the last max_position_embeddings tokens: a note on stderr says
    from where, never a word on stdout (the completion) and nothing when the context fits."""
    long = " ".join(["the quick brown fox jumps over the lazy dog"] * 5)
    from pretrain_cli.data.tokenizer import load_tokenizer

    n = len(load_tokenizer(model_dir).encode(long))
    code, out = _cli(capsys, "--model", model_dir, "--prompt", long, "--max_new_tokens", "2", "--json")
    assert code == 0 and n > 16 and "completion" in json.loads(out.out)  # stdout: the JSON alone
    assert f"note: --prompt is {n} tokens, more than the model's max_position_embeddings (16): it saw only the " \
           f"last 16 (the first {n - 16} were dropped)" in out.err
    code, out = _cli(capsys, "--model", model_dir, "--prompt", "the", "--max_new_tokens", "20", "--json")
    got, short = len(json.loads(out.out)["tokens"]), len(load_tokenizer(model_dir).encode("the"))
    first = generation.first_slid_token(short, got, 16)  # (None if an EOS had ended the generation early)
    assert code == 0 and first == 18 - short
    assert f"max_position_embeddings (16) from generated token {first} of {got} on: from there the model saw only " \
           f"the last 16 tokens" in out.err
    code, out = _cli(capsys, "--model", model_dir, "--prompt", "the", "--max_new_tokens", "3")
    assert code == 0 and "note:" not in out.err


@pytest.mark.parametrize("option, value", [("--temperature", "nan"), ("--temperature", "inf"),
                                           ("--temperature", "-1"), ("--top_p", "nan"), ("--top_p", "0"),
                                           ("--top_k", "-1"), ("--seed", "-1"), ("--seed", str(2**32))])
def test_bad_sampling_options_are_one_line_errors(model_dir, capsys, option, value):
    code, out = _cli(capsys, "--model", model_dir, "--prompt", "the", "--temperature", "1", option, value)
    lines = out.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {option}: must be") and out.out == ""


def test_a_prompt_file_continues_each_prompt_as_prompt_would(model_dir, capsys, tmp_path):
    """--prompt_file loads the model once and continues every prompt exactly as a --prompt call (same seed, same
    text), in order: lines of text, or a .jsonl file's "prompt"/"text" strings."""
    prompts = ["the quick", "brown fox jumps", "over"]
    alone = []
    for p in prompts:
        code, out = _cli(capsys, "--model", model_dir, "--prompt", p, "--max_new_tokens", "4", "--temperature",
                         "0.8", "--seed", "3", "--json")
        alone.append(json.loads(out.out))
    lines = tmp_path / "prompts.txt"
    lines.write_text("\n".join([prompts[0], "", *prompts[1:]]) + "\n")
    jsonl = tmp_path / "prompts.jsonl"
    jsonl.write_text("\n".join(json.dumps({"prompt": p} if i else {"text": p}) for i, p in enumerate(prompts)))
    for f in (lines, jsonl):
        code, out = _cli(capsys, "--model", model_dir, "--prompt_file", str(f), "--max_new_tokens", "4",
                         "--temperature", "0.8", "--seed", "3", "--json")
        got = [json.loads(line) for line in out.out.splitlines()]
        assert code == 0 and [(g["prompt"], g["tokens"]) for g in got] == [(a["prompt"], a["tokens"]) for a in alone]
    code, out = _cli(capsys, "--model", model_dir, "--prompt_file", str(lines), "--max_new_tokens", "4",
                     "--temperature", "0.8", "--seed", "3")
    assert code == 0 and out.out == "\n\n".join(a["prompt"] + a["completion"] for a in alone) + "\n"
    long = " ".join(["the quick brown fox jumps over the lazy dog"] * 5)
    lines.write_text(f"the\n{long}\n")
    code, out = _cli(capsys, "--model", model_dir, "--prompt_file", str(lines), "--max_new_tokens", "1")
    assert code == 0 and f"note: the prompt at {lines}:2 is " in out.err


@pytest.mark.parametrize("content, said", [("", "holds no prompt"), ("{\"prompt\": 3}\n", ":1: needs a \"prompt\""),
                                           ("\n[1\n", ":2:3: invalid JSON: the JSON ends before its closing } or ]")])
def test_a_bad_prompt_file_is_one_line_naming_the_line(model_dir, capsys, tmp_path, content, said):
    f = tmp_path / "p.jsonl"
    f.write_text(content)
    code, out = _cli(capsys, "--model", model_dir, "--prompt_file", str(f))
    lines = out.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and said in lines[0] and out.out == ""
    code, out = _cli(capsys, "--model", model_dir, "--prompt_file", str(tmp_path / "missing.txt"))
    assert code == 2 and "error: --prompt_file: cannot read" in out.err
    code, out = _cli(capsys, "--model", model_dir, "--prompt_file", str(f), "--prompt", "x")
    assert code == 2 and "not allowed with argument" in out.err


def test_generate_prints_a_split_character_whole_and_says_what_did_not_decode(model_dir, capsys, monkeypatch):
    """The model's choice faked (a byte-level tokenizer trained on ASCII: one token per byte of 日本): a character
    split across tokens prints whole; one `--max_new_tokens` cut is held back, not printed as U+FFFD; bytes that
    form no character print as U+FFFD with one note counting them (tests/unit/test_generated_text.py: each case
    against transformers' decode)."""
    from pretrain_cli.data.generated_text import _byte_level_chars
    from pretrain_cli.data.tokenizer import load_tokenizer

    tok = load_tokenizer(model_dir)
    char = {b: c for c, b in _byte_level_chars().items()}
    chosen = []
    monkeypatch.setattr(generation, "generate", lambda model, ids, n, **kw: np.array([list(ids[0]) + chosen[:n]]))
    chosen[:] = [tok.token_to_id(char[b]) for b in " 日本".encode()]  # 7 tokens
    code, out = _cli(capsys, "--model", model_dir, "--prompt", "the", "--max_new_tokens", "7")
    assert code == 0 and out.out == "the 日本\n" and "byte" not in out.err
    code, out = _cli(capsys, "--model", model_dir, "--prompt", "the", "--max_new_tokens", "6")
    assert code == 0 and out.out == "the 日\n"
    assert "note: the last 2 generated bytes begin a character that --max_new_tokens (6) cut" in out.err
    code, out = _cli(capsys, "--model", model_dir, "--prompt", "the", "--max_new_tokens", "6", "--json")
    got = json.loads(out.out)
    assert (got["completion"], got["tokens"], got["invalid_bytes"], got["cut_bytes"]) == (" 日", chosen[:6], 0, 2)
    chosen[:] = [*tok.encode(" a"), tok.token_to_id(char[0x97]), *tok.encode("b"), tok.eos_token_id]
    code, out = _cli(capsys, "--model", model_dir, "--prompt", "the", "--max_new_tokens", "8", "--json")
    got = json.loads(out.out)
    assert (got["completion"], got["tokens"], got["invalid_bytes"]) == (" a\ufffdb", chosen[:-1], 1)
    assert "note: 1 generated byte forms no UTF-8 character, printed as U+FFFD" in out.err
    # a lead byte then EOS: the model finished on half a character, not cut by --max_new_tokens (which it also
    # reached): U+FFFD, counted as a byte that forms no character, no cut note
    chosen[:] = [*tok.encode(" a"), tok.token_to_id(char[0xE6]), tok.eos_token_id]
    code, out = _cli(capsys, "--model", model_dir, "--prompt", "the", "--max_new_tokens", str(len(chosen)), "--json")
    got = json.loads(out.out)
    assert (got["completion"], got["invalid_bytes"], got["cut_bytes"]) == (" a\ufffd", 1, 0)
    assert "note: 1 generated byte forms no UTF-8 character" in out.err and "--max_new_tokens (" not in out.err


def test_a_stdout_that_cannot_encode_the_text_prints_escapes_not_a_traceback(model_dir):
    """Under PYTHONIOENCODING=latin-1 a prompt in another script (printed back with its completion) cannot be
    encoded: the entry point prints it as backslash escapes, exit 0 (a real process: the encoding is set at start)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONIOENCODING": "latin-1"}
    done = subprocess.run([sys.executable, "-m", "pretrain_cli", "generate", "--model", model_dir, "--prompt",
                           "über 日本", "--max_new_tokens", "2"], env=env, capture_output=True, timeout=600)
    assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr.decode("latin-1")[-2000:]
    assert done.stdout.startswith("über \\u65e5\\u672c".encode("latin-1"))
