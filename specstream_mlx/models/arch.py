"""The thin adapter over mlx-lm models that the tree decoder needs: embedding, blocks, final norm,
LM head, and per-token rotary positions. No architecture files are copied: llama/mistral, qwen2,
qwen3 and phi3 in mlx-lm share the block layout used here (input_layernorm -> self_attn ->
post_attention_layernorm -> mlp), and q/k norms, biases and fused projections stay inside
the modules."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import mlx.core as mx
import mlx.nn as nn

from ..errors import SpecstreamError

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3", "phi3")


class PositionedRoPE(nn.Module):
    """Wraps a model's RoPE; while `positions` is set, token i is rotated to positions[i].

    mx.fast.rope takes one offset per batch row, so the token axis is moved onto the batch axis.
    """

    def __init__(self, rope: nn.Module):
        super().__init__()
        self.inner = rope
        self.positions: mx.array | None = None

    def __call__(self, x: mx.array, offset=0) -> mx.array:
        if self.positions is None:
            return self.inner(x, offset=offset)
        # (1, H, T, D) -> (T, H, 1, D): each token its own batch row and offset
        return self.inner(x.transpose(2, 1, 0, 3), offset=self.positions).transpose(2, 1, 0, 3)


@dataclass
class Arch:
    embed: nn.Module
    layers: list
    norm: nn.Module
    lm_head: Callable[[mx.array], mx.array]
    ropes: list[PositionedRoPE]
    dims: int
    head_rows: Callable[[mx.array], mx.array]  # (K,) ids -> (K, d) the head's weights of them

    def head_columns(self, ids: mx.array) -> mx.array:
        """(d, K): the LM head's weights for tokens `ids` (x @ them gives the head's logits of
        those tokens; any head: its own, tied or quantized), read off the K rows alone (the
        head applied to an identity costs d whole-vocabulary rows: ~100 s for Qwen2.5-0.5B on
        the dev CPU)."""
        return self.head_rows(ids).T

    @contextmanager
    def positions(self, positions: mx.array):
        """Rotate the tokens of the next forward passes to explicit positions."""
        for rope in self.ropes:
            rope.positions = positions
        try:
            yield
        finally:
            for rope in self.ropes:
                rope.positions = None


def arch_of(model: nn.Module, model_type: str) -> Arch:
    """Adapt an mlx-lm model (patching its RoPE modules in place once)."""
    if model_type not in SUPPORTED:
        raise SpecstreamError(
            f"speculative decoding supports {', '.join(SUPPORTED)}; this model is {model_type!r}"
        )
    inner = model.model
    ropes = []
    for layer in inner.layers:
        if not isinstance(layer.self_attn.rope, PositionedRoPE):
            layer.self_attn.rope = PositionedRoPE(layer.self_attn.rope)
        ropes.append(layer.self_attn.rope)
    if "lm_head" in model:
        head, rows = model.lm_head, partial(_linear_rows, model.lm_head)
    else:  # tied: the embedding's rows (dequantized by a quantized embedding)
        head, rows = inner.embed_tokens.as_linear, inner.embed_tokens
    dims = model.args.hidden_size
    return Arch(inner.embed_tokens, inner.layers, inner.norm, head, ropes, dims, rows)


def _linear_rows(linear: nn.Module, ids: mx.array) -> mx.array:
    """A head's weight rows for `ids`, dequantized as nn.QuantizedLinear computes with them."""
    if "scales" not in linear:
        return linear.weight[ids]
    biases = linear.get("biases")
    return mx.dequantize(
        linear.weight[ids],
        scales=linear.scales[ids],
        biases=biases[ids] if biases is not None else None,
        group_size=linear.group_size,
        bits=linear.bits,
        mode=linear.mode,
    )
