"""KV-cache views and compaction for tree steps."""

from __future__ import annotations

import mlx.core as mx


class MainOnlyCache:
    """A view of a layer's KV cache for an MSA layer: only the first `n_main` rows (the main
    stream) are stored; stream rows are attended to in this pass and then forgotten."""

    def __init__(self, cache, n_main: int):
        self.cache = cache
        self.n_main = n_main

    @property
    def offset(self) -> int:
        return self.cache.offset

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        n = self.n_main
        k, v = self.cache.update_and_fetch(keys[:, :, :n], values[:, :, :n])  # (B, H, S, D)
        return (
            mx.concatenate([k, keys[:, :, n:]], axis=2),
            mx.concatenate([v, values[:, :, n:]], axis=2),
        )


def compact(cache, start: int, keep: list[int]) -> None:
    """Keep rows start + keep[i] at start + i and drop the rest of this step's rows.

    Rows are written in increasing order and keep[i] >= i, so moving in place is safe.
    """
    idx = mx.array(keep) + start
    n = len(keep)
    cache.keys[..., start : start + n, :] = cache.keys[..., idx, :]
    cache.values[..., start : start + n, :] = cache.values[..., idx, :]
    cache.offset = start + n
