"""Shared-mode LoRA: low-rank adapters on every linear layer of every block, kept unfused
(mlx-lm's LoRALinear wraps the base layer, whose weights are never changed), so the base stays
intact and an adapter can be taken off again."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.tuner.lora import LoRALinear
from mlx_lm.tuner.utils import linear_to_lora_layers

PREFIX = "lora."  # LoRA tensors in adapters.safetensors: "lora." + the model's parameter path


def has_lora(model: nn.Module) -> bool:
    return any(isinstance(m, LoRALinear) for _, m in model.named_modules())


def lora_settings(model: nn.Module) -> set[tuple[int, float]]:
    """{(rank, scale)} of the LoRA layers on the model (empty: none)."""
    return {
        (m.lora_a.shape[1], float(m.scale))
        for _, m in model.named_modules()
        if isinstance(m, LoRALinear)
    }


def expected_lora_shapes(model: nn.Module, rank: int) -> dict[str, tuple[int, ...]]:
    """The LoRA tensors `apply_lora(model, rank, ...)` would create, without touching the model:
    name -> shape. Quantized layers count their unpacked input size."""
    shapes = {}
    for i, layer in enumerate(model.model.layers):
        wrapped = [n for n, m in layer.named_modules() if isinstance(m, LoRALinear)]
        for name, m in layer.named_modules():
            if any(name.startswith(w + ".") for w in wrapped):
                continue  # the base layer inside a LoRALinear
            base = m.linear if isinstance(m, LoRALinear) else m
            if isinstance(base, nn.QuantizedLinear):
                out_dims, packed = base.weight.shape
                in_dims = packed * 32 // base.bits
            elif isinstance(base, nn.Linear):
                out_dims, in_dims = base.weight.shape
            else:
                continue
            key = f"{PREFIX}model.layers.{i}.{name}"
            shapes[f"{key}.lora_a"] = (in_dims, rank)
            shapes[f"{key}.lora_b"] = (rank, out_dims)
    return shapes


def apply_lora(model: nn.Module, rank: int, scale: float) -> None:
    """Wrap every linear layer of every block in a LoRALinear (b = 0: the output is unchanged
    until trained). The base weights are frozen."""
    if has_lora(model):
        remove_lora(model)
    model.freeze()
    config = {"rank": rank, "scale": scale, "dropout": 0.0}
    linear_to_lora_layers(model.model, len(model.model.layers), config)


def remove_lora(model: nn.Module) -> None:
    """Put the original layers back: the base model as loaded."""
    for layer in model.model.layers:
        originals = [
            (name, m.linear) for name, m in layer.named_modules() if isinstance(m, LoRALinear)
        ]
        if originals:
            layer.update_modules(tree_unflatten(originals))


def lora_weights(model: nn.Module) -> dict[str, mx.array]:
    """The LoRA tensors, named PREFIX + parameter path."""
    return {
        PREFIX + name: w
        for name, w in tree_flatten(model.parameters())
        if name.endswith((".lora_a", ".lora_b"))
    }


def load_lora_weights(model: nn.Module, weights: dict[str, mx.array]) -> None:
    model.update(tree_unflatten([(k[len(PREFIX) :], v) for k, v in weights.items()]))
