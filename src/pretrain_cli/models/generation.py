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
    if temperature <= 0:
        return logits.astype(np.float64).argmax(-1)
    probs = next_token_probs(logits, temperature, top_k, top_p)
    return np.array([rng.choice(probs.shape[-1], p=row) for row in probs])


def next_token_probs(logits: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0) -> np.ndarray:
    """The distribution `sample_next` draws from, `[bsz, vocab]` float64: logits / temperature, then the `top_k`
    best (ties kept), then the smallest set holding `top_p` of the mass (the top token always): transformers'
    temperature, top-k and top-p warpers, in their order."""
    logits = logits.astype(np.float64) / temperature
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
    return probs


def context_window(max_position_embeddings: int, trained: int | None = None) -> tuple[int, str]:
    """(the most tokens the model reads at once, what that number is, for a note): config.json's
    max_position_embeddings, or the longer length the directory's weights were trained at (`trained`, its
    args.json's `trained_length`: the longest over the runs that led to them): a model continued past its range
    keeps the pretrained number in config.json (`models.config.past_positions`), and a window cut there would drop
    context it was trained to read."""
    if isinstance(trained, int) and trained > max_position_embeddings:
        return trained, (f"the {trained} tokens its run trained on (args.json's trained_length; config.json keeps "
                         f"max_position_embeddings {max_position_embeddings})")
    return max_position_embeddings, f"the model's max_position_embeddings ({max_position_embeddings})"


def first_slid_token(prompt_len: int, new_tokens: int, limit: int) -> int | None:
    """1-based number of the first of `new_tokens` generated tokens that `generate` predicted from a context cut
    to its last `limit` tokens (token j is predicted from prompt_len + j - 1 tokens), None when the context never
    outgrew `limit`: what a caller needs to tell its user where the output stops reading the whole context."""
    first = max(1, limit - prompt_len + 2)
    return first if first <= new_tokens else None


def stop_ids(eos_token_id) -> set[int]:
    """The ids `eos_token_id` names: None, one id, or a list of them (as config.json may hold)."""
    if eos_token_id is None:
        return set()
    if isinstance(eos_token_id, (list, tuple, set)):
        return {int(i) for i in eos_token_id if i is not None}
    return {int(eos_token_id)}


def generate(model, input_ids, max_new_tokens: int, temperature: float = 0.0, top_k: int = 0,
             top_p: float = 1.0, eos_token_id=None, seed: int = 0,
             max_length: int | None = None, use_cache: bool = True) -> np.ndarray:
    """Append up to `max_new_tokens` tokens to `input_ids` `[bsz, seq]` (int); returns int64 numpy.

    `eos_token_id`: one id or several (transformers' `generation_config.eos_token_id` may be a list); a row
    that produced one keeps emitting it; the context is cut to the last `max_length` tokens (default
    `max_position_embeddings`; `context_window` gives the length a run trained past it). Same seed → same tokens;
    `use_cache=False` re-runs the prefix each step (the reference the cache is tested against).
    """
    import paddle

    from pretrain_cli.ops.tensors import from_numpy  # (paddle.to_tensor leaks at every call: every token)

    rng = np.random.default_rng(seed)
    ids = np.asarray(input_ids, dtype=np.int64)
    limit = max_length or model.config.max_position_embeddings
    stops = np.array(sorted(stop_ids(eos_token_id)), dtype=np.int64)
    done = np.zeros(ids.shape[0], dtype=bool)
    model.eval()
    cache = None
    with paddle.no_grad():
        for _ in range(max_new_tokens):
            if not use_cache:
                out = model(from_numpy(ids[:, -limit:]))  # [bsz, ctx_len, vocab]
            elif cache is None or cache.offset + 1 > limit:  # prefill, or the window slid: rebuild
                cache = model.new_cache()
                out = model(from_numpy(ids[:, -limit:]), cache)  # [bsz, ctx_len, vocab]
            else:
                out = model(from_numpy(ids[:, -1:]), cache)  # [bsz, 1, vocab]
            logits = out[:, -1, :].astype("float32").numpy()  # [bsz, vocab]
            nxt = sample_next(logits, rng, temperature, top_k, top_p)
            if stops.size:
                nxt = np.where(done, ids[:, -1], nxt)  # a finished row repeats the EOS it produced
                done |= np.isin(nxt, stops)
            ids = np.concatenate([ids, nxt[:, None].astype(np.int64)], axis=1)  # [bsz, seq+1]
            if done.all():
                break
    return ids
