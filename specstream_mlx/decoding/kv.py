"""KV-cache views and compaction for tree steps; mlx-lm's KVCache and QuantizedKVCache."""

from __future__ import annotations

import mlx.core as mx
from mlx.utils import tree_map


def _concat(stored, new):
    """Append this pass's stream rows to what the cache returned (arrays or quantized tuples)."""
    if isinstance(stored, tuple):
        return tuple(mx.concatenate([s, n], axis=2) for s, n in zip(stored, new, strict=True))
    return mx.concatenate([stored, new], axis=2)


class MainOnlyCache:
    """A view of a layer's KV cache for an MSA layer: only the first `n_main` rows (the main
    stream) are stored; stream rows are attended to in this pass and then forgotten."""

    def __init__(self, cache, n_main: int):
        self.cache = cache
        self.n_main = n_main
        if hasattr(cache, "bits"):  # mlx-lm picks quantized attention when the cache has `bits`
            self.bits, self.group_size = cache.bits, cache.group_size

    @property
    def offset(self) -> int:
        return self.cache.offset

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        n = self.n_main  # keys, values: (B, H, T, D)
        k, v = self.cache.update_and_fetch(keys[:, :, :n], values[:, :, :n])
        k_new, v_new = keys[:, :, n:], values[:, :, n:]
        if hasattr(self, "bits"):
            k_new = mx.quantize(k_new, group_size=self.group_size, bits=self.bits)
            v_new = mx.quantize(v_new, group_size=self.group_size, bits=self.bits)
        return _concat(k, k_new), _concat(v, v_new)


def compact(cache, start: int, keep: list[int]) -> None:
    """Keep rows start + keep[i] at start + i and drop the rest of this step's rows."""
    n = len(keep)
    if keep == list(range(n)):  # already in place (a chain's accepted prefix): nothing to move
        cache.offset = start + n
        return
    idx = mx.array(keep) + start

    def move(x):
        x[..., start : start + n, :] = x[..., idx, :]
        return x

    cache.keys, cache.values = tree_map(move, (cache.keys, cache.values))
    cache.offset = start + n
