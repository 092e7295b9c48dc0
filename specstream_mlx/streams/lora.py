"""Shared-mode LoRA: low-rank adapters on every linear layer of every block, or of the blocks an
adapter names (its lora_blocks: the top ones it trained). Trained (and run on a quantized base)
unfused: mlx-lm's LoRALinear wraps the base layer, whose weights never change.
Decoded on a float base fused (`fuse_lora`): W0 + s * (a @ b)^T in the Linear itself, the
untouched W0 kept aside and put back by `unfuse_lora`, so the base never drifts."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.tuner.lora import LoRALinear

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


def expected_lora_shapes(
    model: nn.Module, rank: int, blocks: tuple[int, ...] | None = None
) -> dict[str, tuple[int, ...]]:
    """The LoRA tensors `apply_lora(model, rank, ...)` would create, without touching the model:
    name -> shape; of `blocks` alone when given (an adapter's lora_blocks: what its file holds).
    Quantized layers count their unpacked input size."""
    shapes = {}
    for i, layer in enumerate(model.model.layers):
        if blocks is not None and i not in blocks:
            continue
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


def apply_lora(
    model: nn.Module, rank: int, scale: float, blocks: tuple[int, ...] | None = None
) -> None:
    """Wrap every linear layer of every block (or of `blocks` alone) in a LoRALinear (b = 0:
    the output is unchanged until trained). The base weights are frozen."""
    if current_lora(model) is not None:
        remove_lora(model)
    model.freeze()
    blocks = _all_blocks(model) if blocks is None else tuple(blocks)
    for i in blocks:
        layer = model.model.layers[i]
        linears = [
            (name, LoRALinear.from_base(m, r=rank, dropout=0.0, scale=scale))
            for name, m in layer.named_modules()
            if isinstance(m, (nn.Linear, nn.QuantizedLinear))
        ]
        layer.update_modules(tree_unflatten(linears))
    kept = _kept(model)
    kept.on, kept.off = ((rank, float(scale), blocks), _layout(model)), None


class _Kept:
    """Where a model's LoRA layers are, so that swaps need not walk the module tree: the ones on
    it now (`on`) and, per (rank, scale, blocks), ones taken off to put back without rebuilding
    them. A plain object: mlx.nn.Module does not count it among the model's parameters."""

    def __init__(self):
        self.on: tuple[tuple[int, float, tuple[int, ...]], list] | None = None
        self.off: list | None = None  # the layers last taken off (their originals are back)
        self.by_setting: dict[tuple[int, float, tuple[int, ...]], list] = {}


def current_lora(model: nn.Module) -> tuple[int, float] | None:
    """(rank, scale) of the LoRA layers on the model, None without any."""
    kept = _kept(model)
    if kept.on is not None and _still_at(kept.on[1], wrapped=True):
        return kept.on[0][:2]
    if kept.on is None and kept.off is not None and _still_at(kept.off, wrapped=False):
        return None
    settings = lora_settings(model)  # put on some other way: look
    if not settings:
        return None
    if len(settings) > 1:
        kept.on = None
        return (-1, 0.0)
    layout = _layout(model)
    blocks = tuple(i for i, layer in enumerate(model.model.layers) if _wrapped(layer))
    kept.on = ((*next(iter(settings)), blocks), layout)
    return next(iter(settings))


def remove_lora(model: nn.Module, keep: bool = False) -> None:
    """Put the original layers back: the base model as loaded. keep=True keeps the LoRA layers
    aside for `put_back_lora` (adapter swaps)."""
    setting = current_lora(model)
    kept = _kept(model)
    key = kept.on[0] if kept.on is not None else None
    taken = kept.on[1] if kept.on is not None else _layout(model)
    for layer, wrapped in taken:
        layer.update_modules(tree_unflatten([(name, m.linear) for name, m in wrapped]))
    kept.on, kept.off = None, taken or None
    if keep and taken and key is not None and setting is not None and setting[0] > 0:
        kept.by_setting[key] = taken


def put_back_lora(
    model: nn.Module, rank: int, scale: float, blocks: tuple[int, ...] | None = None
) -> bool:
    """Put back LoRA layers of this rank and scale on these blocks (None: all) that
    `remove_lora(keep=True)` kept (their tensors are whatever they last held: load the
    adapter's next); False when none were kept."""
    kept = _kept(model)
    blocks = _all_blocks(model) if blocks is None else tuple(blocks)
    key = (rank, float(scale), blocks)
    taken = kept.by_setting.pop(key, None)
    if taken is None:
        return False
    if current_lora(model) is not None:
        remove_lora(model, keep=True)
    for layer, wrapped in taken:
        layer.update_modules(tree_unflatten(wrapped))
    kept.on, kept.off = (key, taken), None
    return True


def _layout(model: nn.Module) -> list:
    """[(block, [(name, LoRALinear), ...]), ...] for the blocks that have LoRA layers."""
    return [(layer, w) for layer in model.model.layers if (w := _wrapped(layer))]


def _wrapped(layer: nn.Module) -> list:
    return [(name, m) for name, m in layer.named_modules() if isinstance(m, LoRALinear)]


def _all_blocks(model: nn.Module) -> tuple[int, ...]:
    return tuple(range(len(model.model.layers)))


def _still_at(taken: list, wrapped: bool) -> bool:
    """Whether the first recorded LoRA layer (wrapped=True), or the original it wraps, is still
    in its place: nothing was swapped behind these functions' back."""
    if not taken:
        return False
    layer, modules = taken[0]
    name, module = modules[0]
    node = layer
    for part in name.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node is (module if wrapped else module.linear)


def _kept(model: nn.Module) -> _Kept:
    if not isinstance(getattr(model, "_specstream_kept_lora", None), _Kept):
        object.__setattr__(model, "_specstream_kept_lora", _Kept())
    return model._specstream_kept_lora


def lora_weights(model: nn.Module) -> dict[str, mx.array]:
    """The LoRA tensors, named PREFIX + parameter path."""
    return {
        PREFIX + name: w
        for name, w in tree_flatten(model.parameters())
        if name.endswith((".lora_a", ".lora_b"))
    }


def lora_block(name: str) -> int:
    """The block index in a LoRA tensor name (PREFIX + model.layers.<i>. ...)."""
    return int(name.split(".layers.", 1)[1].split(".", 1)[0])


def stored_blocks(lora: dict[str, mx.array]) -> tuple[int, ...]:
    """The blocks a set of LoRA tensors covers, in order."""
    return tuple(sorted({lora_block(k) for k in lora}))


def blocks_in_use(lora: dict[str, mx.array]) -> set[int]:
    """The blocks whose LoRA b is nonzero: the others add nothing."""
    names = [k for k in lora if k.endswith(".lora_b")]
    used = [mx.any(lora[k] != 0) for k in names]
    mx.eval(used)
    return {lora_block(k) for k, u in zip(names, used, strict=True) if u.item()}


def load_lora_weights(model: nn.Module, weights: dict[str, mx.array]) -> None:
    """Point the LoRA layers at `weights` (PREFIX + parameter path -> tensor). Each tensor is set
    where its path leads (modules are dicts, layer lists are indexed): far quicker than
    `model.update` for an adapter swap, which rebuilds the whole parameter tree."""
    for key, value in weights.items():
        *path, leaf = key[len(PREFIX) :].split(".")
        node = model
        for part in path:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if leaf not in node:
            raise KeyError(f"no LoRA tensor {key} on the model")
        node[leaf] = value


class Fused:
    """LoRA fused into the base weights: W = W0 + scale * (a @ b)^T, computed from the untouched
    base W0 kept here (`base`), so outputs never drift however often adapters swap; `weights`
    the fused W, which a later `fuse_lora(..., reuse=)` of the same adapter puts back as they are
    instead of computing them again (an adapter manager's swaps)."""

    def __init__(self, base: dict[str, mx.array], weights: dict[str, mx.array]):
        self.base = base  # parameter path of each Linear -> the base weight it replaced
        self.weights = weights  # parameter path -> W0 + delta

    @property
    def nbytes(self) -> int:
        """Memory of the fused weights (the base ones belong to the model)."""
        return sum(w.nbytes for w in self.weights.values())


def can_fuse(model: nn.Module, lora: dict[str, mx.array]) -> bool:
    """Whether every LoRA target is a float nn.Linear (a quantized base stays unfused: fusing
    would re-quantize it)."""
    return all(type(_module(model, path)) is nn.Linear for path in _targets(lora))


def fuse_lora(
    model: nn.Module, lora: dict[str, mx.array], scale: float, reuse: Fused | None = None
) -> Fused:
    """Put `lora` (PREFIX + path.lora_a / .lora_b) into the base weights; the base model must
    carry no LoRA layers and nothing fused (`unfuse_lora` first). Targets whose b is zero (the
    blocks an adapter trained with lora_layers left alone) add nothing and are skipped.
    `reuse`: this adapter fused before on this model: its weights are put back as they are when
    the base weights under them are still the ones they were computed from."""
    if reuse is not None and all(
        _module(model, path).weight is w0 for path, w0 in reuse.base.items()
    ):
        for path, w in reuse.weights.items():
            _module(model, path).weight = w
        return reuse
    base, weights, targets = {}, {}, _targets(lora)
    used = [mx.any(lora[f"{PREFIX}{path}.lora_b"] != 0) for path in targets]
    mx.eval(used)
    for path in (p for p, u in zip(targets, used, strict=True) if u.item()):
        linear = _module(model, path)
        w0 = linear.weight  # (out, in)
        a, b = lora[f"{PREFIX}{path}.lora_a"], lora[f"{PREFIX}{path}.lora_b"]  # (in, r), (r, out)
        delta = (scale * (a @ b)).T.astype(w0.dtype)
        linear.weight = weights[path] = w0 + delta
        base[path] = w0
    mx.eval(list(weights.values()))
    return Fused(base, weights)


def unfuse_lora(model: nn.Module, fused: Fused | None) -> None:
    """Put the base weights back."""
    if fused is None:
        return
    for path, w0 in fused.base.items():
        _module(model, path).weight = w0


def _targets(lora: dict[str, mx.array]) -> list[str]:
    return sorted({k[len(PREFIX) : -len(".lora_a")] for k in lora if k.endswith(".lora_a")})


def _module(model: nn.Module, path: str) -> nn.Module:
    node = model
    for part in path.split("."):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node
