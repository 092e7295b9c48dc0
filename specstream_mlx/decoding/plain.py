"""Plain autoregressive decoding: the reference every speculative result is compared with."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from .compiled import compilable
from .step import Step

PREFILL_CHUNK = 512  # prompt tokens per forward pass while prefilling: bounds activation memory
KV_GROUP_SIZE = 32  # for quantized KV caches; must divide the head dimension


def make_cache(model: nn.Module, kv_bits: int | None = None) -> list:
    """mlx-lm's per-layer KV caches, quantized to `kv_bits` (4 or 8) when given."""
    cache = make_prompt_cache(model)
    if kv_bits:
        cache = [c.to_quantized(group_size=KV_GROUP_SIZE, bits=kv_bits) for c in cache]
    return cache


def prefill(model: nn.Module, prompt: mx.array, cache: list) -> mx.array:
    """Run all prompt tokens through the model; returns the (V,) logits of the last one."""
    while prompt.size > PREFILL_CHUNK:
        model(prompt[None, :PREFILL_CHUNK], cache=cache)
        mx.eval([c.state for c in cache])
        prompt = prompt[PREFILL_CHUNK:]
    return model(prompt[None], cache=cache)[0, -1]  # (V,)


def plain_decode(
    model: nn.Module,
    prompt_ids: list[int],
    max_tokens: int,
    sample: Callable[[mx.array], mx.array],
    kv_bits: int | None = None,
    compiled=None,
) -> Iterator[Step]:
    """Yield one token per forward pass, at most `max_tokens` times.

    `compiled` (decoding.compiled.CompiledPasses of the model alone) runs each step as one
    compiled graph; None runs mlx-lm's model eagerly.

    The next forward pass is queued (`mx.async_eval`) before the current token is handed out, so
    the caller's detokenizing and printing overlap with the model's work.
    """
    cache = make_cache(model, kv_bits)
    token = sample(prefill(model, mx.array(prompt_ids), cache))
    mx.async_eval(token)
    if compiled is not None and not compilable(cache):
        compiled = None
    for n in range(max_tokens):
        if n + 1 < max_tokens:
            if compiled is not None:
                next_token = sample(compiled.next_logits(token, cache))
            else:
                next_token = sample(model(token.reshape(1, 1), cache=cache)[0, -1])
            mx.async_eval(next_token)
        yield Step([token.item()])
        if n + 1 < max_tokens:
            token = next_token
