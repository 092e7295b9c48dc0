"""Quality measures of a model that do not depend on a decoder."""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn


def perplexity(model: nn.Module, ids: list[int]) -> float:
    """exp(mean next-token NLL) of `ids` under `model`, one forward pass, no BOS added."""
    x = mx.array(ids)[None]  # (1, T)
    logits = model(x[:, :-1]).astype(mx.float32)  # (1, T-1, V)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    return math.exp(-mx.take_along_axis(logprobs, x[:, 1:, None], axis=-1).mean().item())
