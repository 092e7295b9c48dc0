"""Token choice from logits: greedy, or temperature with top-k / top-p, seeded.

`probabilities` returns the exact distribution a token is drawn from, so the speculative decoder
can reuse it for rejection sampling and stay distribution-exact.
"""

from __future__ import annotations

import random

import mlx.core as mx

from .sampling_params import SamplingParams


def probabilities(logits: mx.array, params: SamplingParams) -> mx.array:
    """(..., V) logits -> (..., V) float32 probabilities after temperature, top-k and top-p."""
    logits = logits.astype(mx.float32) / params.temperature
    if 0 < params.top_k < logits.shape[-1]:
        kth = mx.sort(logits, axis=-1)[..., -params.top_k, None]
        logits = mx.where(logits < kth, -mx.inf, logits)
    probs = mx.softmax(logits, axis=-1)
    if params.top_p < 1:
        # Keep the smallest set of most likely tokens whose mass reaches top_p, and every token
        # tied with the last one kept (so the set never depends on how a sort orders ties).
        sorted_probs = -mx.sort(-probs, axis=-1)
        keep = (mx.cumsum(sorted_probs, axis=-1) - sorted_probs) < params.top_p  # a prefix
        last = keep.astype(mx.int32).sum(axis=-1, keepdims=True) - 1
        cutoff = mx.take_along_axis(sorted_probs, last, axis=-1)
        probs = mx.where(probs >= cutoff, probs, 0.0)
        probs = probs / probs.sum(axis=-1, keepdims=True)
    return probs


class Sampler:
    """Draws one token per call from (V,) logits; a fixed seed replays the same draws."""

    def __init__(self, params: SamplingParams):
        self.params = params
        seed = params.seed if params.seed is not None else random.getrandbits(32)
        self._key = mx.random.key(seed)

    def __call__(self, logits: mx.array) -> mx.array:
        if self.params.greedy:
            return mx.argmax(logits, axis=-1)
        self._key, key = mx.random.split(self._key)
        return mx.random.categorical(mx.log(probabilities(logits, self.params)), key=key)
