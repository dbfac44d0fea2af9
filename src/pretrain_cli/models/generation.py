"""Sampling from a CausalLM: greedy, temperature, top-k, top-p, with a KV cache.

With the cache the prompt runs once (prefill) and each new token costs one position, not the
whole prefix again. The cache lives outside the model (`CausalLM.new_cache()`), so the training
forward never sees it. When the context would exceed `max_length`, the cache is rebuilt from the
last `max_length` tokens: exactly what the uncached loop feeds the model, so both agree.
"""
from __future__ import annotations

import numpy as np


def sample_next(logits: np.ndarray, rng: np.random.Generator, temperature: float = 1.0,
                top_k: int = 0, top_p: float = 1.0) -> np.ndarray:
    """Next token per row from fp32 logits `[bsz, vocab]`; temperature 0 means greedy."""
    logits = logits.astype(np.float64)
    if temperature <= 0:
        return logits.argmax(-1)
    logits = logits / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = np.sort(logits, axis=-1)[:, -top_k][:, None]
        logits = np.where(logits < kth, -np.inf, logits)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    if top_p < 1.0:
        order = np.argsort(-probs, axis=-1)
        sorted_p = np.take_along_axis(probs, order, -1)
        keep_sorted = np.cumsum(sorted_p, -1) - sorted_p < top_p  # always keeps the top token
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, -1)
        probs = np.where(keep, probs, 0.0)
        probs /= probs.sum(-1, keepdims=True)
    return np.array([rng.choice(probs.shape[-1], p=row) for row in probs])


def first_slid_token(prompt_len: int, new_tokens: int, limit: int) -> int | None:
    """1-based number of the first of `new_tokens` generated tokens that `generate` predicted from a context cut
    to its last `limit` tokens (token j is predicted from prompt_len + j - 1 tokens), None when the context never
    outgrew `limit`: what a caller needs to tell its user where the output stops reading the whole context."""
    first = max(1, limit - prompt_len + 2)
    return first if first <= new_tokens else None


def generate(model, input_ids, max_new_tokens: int, temperature: float = 0.0, top_k: int = 0,
             top_p: float = 1.0, eos_token_id: int | None = None, seed: int = 0,
             max_length: int | None = None, use_cache: bool = True) -> np.ndarray:
    """Append up to `max_new_tokens` tokens to `input_ids` `[bsz, seq]` (int); returns int64 numpy.

    Rows that produced `eos_token_id` keep emitting it; the context is cut to the last
    `max_length` tokens (default `max_position_embeddings`). Same seed → same tokens;
    `use_cache=False` re-runs the prefix each step (the reference the cache is tested against).
    """
    import paddle

    rng = np.random.default_rng(seed)
    ids = np.asarray(input_ids, dtype=np.int64)
    limit = max_length or model.config.max_position_embeddings
    done = np.zeros(ids.shape[0], dtype=bool)
    model.eval()
    cache = None
    with paddle.no_grad():
        for _ in range(max_new_tokens):
            if not use_cache:
                out = model(paddle.to_tensor(ids[:, -limit:]))  # [bsz, ctx_len, vocab]
            elif cache is None or cache.offset + 1 > limit:  # prefill, or the window slid: rebuild
                cache = model.new_cache()
                out = model(paddle.to_tensor(ids[:, -limit:]), cache)  # [bsz, ctx_len, vocab]
            else:
                out = model(paddle.to_tensor(ids[:, -1:]), cache)  # [bsz, 1, vocab]
            logits = out[:, -1, :].astype("float32").numpy()  # [bsz, vocab]
            nxt = sample_next(logits, rng, temperature, top_k, top_p)
            if eos_token_id is not None:
                nxt = np.where(done, eos_token_id, nxt)
                done |= nxt == eos_token_id
            ids = np.concatenate([ids, nxt[:, None].astype(np.int64)], axis=1)  # [bsz, seq+1]
            if done.all():
                break
    return ids
