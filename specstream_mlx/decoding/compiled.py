"""Compiled forward passes (`mx.compile`): one traced graph per shape bucket instead of ~1000
Python-dispatched operations per pass, with the element-wise work fused.

A pass reads and writes mlx-lm's own KV caches, but functionally: each layer's whole buffer goes
in, this pass's rows are written at the offset (an array, so one trace serves every offset), and
the new buffer comes out. Attention then spans the whole buffer with a mask that hides the rows
past the offset, so a trace depends only on the tree size, the streams run and the buffer's
capacity (grown in steps of 256 rows): those are the buckets. The tree's shape (ancestors,
depths) arrives as arrays. Quantized KV caches and passes that prune run eagerly.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from ..models.arch import Arch
from .tree import Tree, msa_mask

CAPACITY_STEP = 256
MAX_TRACES = 48  # compiled traces kept per model (or streams), least recently used dropped


class _BufferCache:
    """A layer's KV buffer inside a traced pass: rows written at `offset`, the whole buffer read
    (the mask hides what is past this pass's rows)."""

    def __init__(self, keys: mx.array, values: mx.array, offset: mx.array):
        self.keys, self.values, self._offset = keys, values, offset

    @property
    def offset(self) -> mx.array:
        return self._offset

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        start = self._offset[None]
        self.keys = mx.slice_update(self.keys, keys, start, axes=(2,))
        self.values = mx.slice_update(self.values, values, start, axes=(2,))
        return self.keys, self.values


def reserve(caches: list, rows: int) -> int:
    """Grow every cache's buffer to a multiple of CAPACITY_STEP that holds `rows` more rows; the
    capacity (one bucket of the compiled passes)."""
    offset = caches[0].offset
    need = -(-(offset + rows) // CAPACITY_STEP) * CAPACITY_STEP
    for cache in caches:
        cap = cache.keys.shape[2]
        if cap == need or (cap > need and cap % CAPACITY_STEP == 0):
            continue
        keep_k, keep_v = cache.keys[..., :offset, :], cache.values[..., :offset, :]
        b, h, _, dk = cache.keys.shape
        pad = need - offset
        cache.keys = mx.concatenate([keep_k, mx.zeros((b, h, pad, dk), keep_k.dtype)], axis=2)
        dv = cache.values.shape[3]
        cache.values = mx.concatenate([keep_v, mx.zeros((b, h, pad, dv), keep_v.dtype)], axis=2)
    return caches[0].keys.shape[2]


def compilable(caches: list) -> bool:
    """Plain mlx-lm KV caches (not quantized), already holding the prompt."""
    return all(type(c).__name__ == "KVCache" and c.keys is not None for c in caches)


class CompiledPasses:
    """The compiled tree passes of one model (and, for streams, one StreamParams), cached by
    shape bucket. `params=None`: the model alone (plain decoding, drafts from elsewhere)."""

    def __init__(self, arch: Arch, params=None):
        self.arch, self.params = arch, params
        self._fns: dict[tuple, object] = {}

    def __call__(
        self,
        tree: Tree,
        caches: list,
        n_streams: int = 0,
        stream_logits: bool = False,
        one_head_pass: bool = True,
    ):
        """Run `tree` (every node kept) and return (main logits (N, V), stream logits (N, g, V)
        or stream hidden (N, g, d) or None); the caches hold the N new rows after it."""
        return self.run(
            mx.array(tree.tokens), tree, caches, n_streams, stream_logits, one_head_pass
        )

    def next_logits(self, token: mx.array, caches: list) -> mx.array:
        """Plain decoding's step: the (V,) logits after `token` (may still be lazy)."""
        return self.run(token.reshape(1), Tree([0], [-1], [0]), caches)[0][0]

    def run(self, tokens, tree, caches, n_streams=0, stream_logits=False, one_head_pass=True):
        n = len(tree)
        offset = caches[0].offset
        cap = reserve(caches, n)
        anc = tree.ancestors()
        low_mask = np.zeros((n, cap), bool)
        low_mask[:, :offset] = True
        low_mask[:, offset : offset + n] = anc
        inputs = [tokens, mx.array(tree.depths), mx.array(offset), mx.array(low_mask)]
        streams = 0
        if self.params is not None:
            cfg = self.params.config
            streams = n_streams
            full = msa_mask(anc, offset, streams, cfg.mode == "shared")
            mask = np.zeros((full.shape[0], cap + n * streams), bool)
            mask[:, : offset + n] = full[:, : offset + n]
            mask[:, cap:] = full[:, offset + n :]
            inputs.append(mx.array(mask))
        heads = "one" if stream_logits and one_head_pass else "split"
        key = (n, streams, cap, heads if stream_logits else "main", self._shape(), self._weights())
        fn = self._fns.pop(key, None)
        if fn is None:
            fn = mx.compile(self._pass(n, streams, stream_logits, one_head_pass))
        self._fns[key] = fn  # most recently used last
        while len(self._fns) > MAX_TRACES:
            self._fns.pop(next(iter(self._fns)))
        states = [c.keys for c in caches] + [c.values for c in caches]
        outputs = fn(*inputs, *states)
        k = len(caches)
        new_states = outputs[-2 * k :]
        for i, cache in enumerate(caches):
            cache.keys, cache.values = new_states[i], new_states[k + i]
            cache.offset = offset + n
        main = outputs[0]
        extra = outputs[1] if len(outputs) > 2 * k + 1 else None
        return main, extra

    def _weights(self) -> tuple:
        """A trace holds the arrays it was traced with: LoRA layers put on, taken off or loaded
        with another adapter's tensors (streams.lora, AdapterManager) need a new trace. The
        traces keep their arrays alive, so an id is never reused while its trace exists."""
        layers = self.arch.layers
        return tuple(
            id(v)
            for layer in {id(layers[0]): layers[0], id(layers[-1]): layers[-1]}.values()
            for name, v in tree_flatten(layer.parameters())
            if "lora" in name
        )

    def _shape(self) -> tuple:
        if self.params is None:
            return ()
        cfg = self.params.config
        return (cfg.n_msa_layers, cfg.mode, cfg.gamma)

    def _pass(self, n: int, streams: int, stream_logits: bool, one_head_pass: bool):
        from .tree_step import msa_layers

        arch, params = self.arch, self.params
        n_layers = len(arch.layers)
        n_low = n_layers if params is None else n_layers - params.config.n_msa_layers

        def run(tokens, depths, offset, low_mask, *rest):
            msa = rest[0] if params is not None else None
            states = rest[1:] if params is not None else rest
            caches = [
                _BufferCache(states[i], states[n_layers + i], offset) for i in range(n_layers)
            ]
            h = arch.embed(tokens[None])
            with arch.positions(depths + offset):
                for layer, cache in zip(arch.layers[:n_low], caches[:n_low], strict=True):
                    h = layer(h, low_mask, cache)
            if params is None:
                heads = [arch.lm_head(arch.norm(h[0]))]
            else:
                x = msa_layers(arch, params, h, depths, None, caches, offset, streams, mask=msa)
                if stream_logits and one_head_pass:
                    logits = arch.lm_head(arch.norm(x[0]))
                    heads = [logits[:n], logits[n:].reshape(n, streams, -1)]
                else:
                    heads = [arch.lm_head(arch.norm(x[0, :n])), x[0, n:].reshape(n, streams, -1)]
            return heads + [c.keys for c in caches] + [c.values for c in caches]

        return run
