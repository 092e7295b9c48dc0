"""KV-cache views and compaction for tree steps; mlx-lm's KVCache and QuantizedKVCache."""

from __future__ import annotations

import mlx.core as mx


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


def rewind(caches: list, offset: int, capacity: list[int]) -> None:
    """mlx-lm's plain KV caches (an offset into a buffer) put back to hold their first `offset`
    tokens, in buffers cut back to `capacity` rows (one per cache): what was written past them
    is dropped, and the next write lands where it did when they first held those tokens."""
    for cache, rows in zip(caches, capacity, strict=True):
        cache.keys = cache.keys[..., :rows, :]
        cache.values = cache.values[..., :rows, :]
        cache.offset = offset


def compact(caches: list, start: int, keeps: list[list[int]]) -> None:
    """Keep rows start + keep[i] at start + i of each cache (`keeps`: one list per cache) and
    drop the rest of this step's rows. The rows to move are read (evaluated) before they are
    written back, each half one compiled graph: moving them in one graph, which reads and writes
    the same buffer, makes MLX copy every buffer whole (8-17 ms a pass for SmolLM2's 60 buffers
    of 256-1024 rows on the dev CPU, against about 3: docs/BENCHMARKS.md, "Compaction deferred
    by a pass")."""
    groups: dict[tuple[int, ...], list] = {}
    for cache, keep in zip(caches, keeps, strict=True):
        cache.offset = start + len(keep)
        if keep != list(range(len(keep))):  # a chain's accepted prefix is already in place
            groups.setdefault(tuple(keep), []).append(cache)
    moved = []
    for keep, group in groups.items():
        buffers = [x for cache in group for x in _arrays(cache)]
        moved.append((group, buffers, _gather(mx.array(keep) + start, *buffers)))
    mx.eval([rows for _, _, rows in moved])
    for group, buffers, rows in moved:
        out = _write(mx.array(start), rows, *buffers)
        del buffers[:]  # the old buffers unreferenced: written in place
        for cache in group:
            out = _put(cache, out)


def _arrays(cache) -> list[mx.array]:
    """A cache's keys then values, each an array or quantized (a tuple or list), flattened."""
    return [x for kv in (cache.keys, cache.values) for x in (kv if _quantized(kv) else [kv])]


def _put(cache, arrays: list[mx.array]) -> list[mx.array]:
    """Set the cache's keys and values from the front of `arrays`; returns the rest."""
    n = len(cache.keys) if _quantized(cache.keys) else 1
    keys, values, rest = arrays[:n], arrays[n : 2 * n], arrays[2 * n :]
    if _quantized(cache.keys):
        kind = type(cache.keys)
        cache.keys, cache.values = kind(keys), kind(values)
    else:
        cache.keys, cache.values = keys[0], values[0]
    return rest


def _quantized(kv) -> bool:
    return isinstance(kv, (tuple, list))


@mx.compile
def _gather(idx: mx.array, *buffers: mx.array) -> list[mx.array]:
    return [mx.take(x, idx, axis=2) for x in buffers]


@mx.compile
def _write(start: mx.array, rows: list[mx.array], *buffers: mx.array) -> list[mx.array]:
    return [
        mx.slice_update(x, r, start[None], axes=(2,)) for x, r in zip(buffers, rows, strict=True)
    ]
