"""Forward passes over a draft tree on the KV buffers: one function, run as a compiled graph
(`mx.compile`: ~1000 Python-dispatched operations become one trace, element-wise work fused) or
eagerly.

A pass reads and writes mlx-lm's own KV caches functionally: each layer's whole buffer goes in,
this pass's rows are written at the offset (an array, so one trace serves every position), and
the new buffer comes out. Attention spans the whole buffer with a mask that hides what lies past
the pass's rows, so a trace depends only on the tree size, the streams run and the buffer's
capacity (grown in steps of 256 rows).

`Passes.step` runs a whole greedy pass of a static tree on the device: the forward, acceptance
(argmax comparisons along the tree), the accepted path's rows for the cache compaction and the
next draft (the accepted node's stream top-k), with the offset as an array. Nothing is read back, so
the decoding loop builds the next pass before this one finishes (decoding.loop).

Compaction is deferred by one pass: a pass returns its buffers as written (every tree node's
row) and, apart, the accepted path's rows; the next pass writes those at the old offset before
its own rows. Moving them in the pass that attended to the buffer would write to a buffer the
same graph reads, so MLX would copy every layer's whole buffer (1-2 ms a pass for SmolLM2 at
256-512 rows on the dev CPU); written first thing in the next pass, every write updates its
buffer in place (benchmarks/loop_overhead.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from ..models.arch import Arch
from .policy import StaticShape
from .tree import Tree, msa_mask
from .tree_step import DraftVocab, MsaRows, msa_layers, one_head_pass, stream_logits

CAPACITY_STEP = 256
MAX_TRACES = 48  # traces kept per Passes, least recently used dropped


class _BufferCache:
    """A layer's KV buffer inside a pass: rows written at `offset`, the whole buffer read (the
    mask hides what is past this pass's rows); `rows` keeps this pass's own (keys, values)."""

    def __init__(self, keys: mx.array, values: mx.array, offset: mx.array):
        self.keys, self.values, self._offset = keys, values, offset
        self.rows: tuple[mx.array, mx.array] | None = None

    @property
    def offset(self) -> mx.array:
        return self._offset

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        start = self._offset[None]
        self.keys = mx.slice_update(self.keys, keys, start, axes=(2,))
        self.values = mx.slice_update(self.values, values, start, axes=(2,))
        self.rows = (keys, values)
        return self.keys, self.values


@dataclass
class Kept:
    """The last pass's accepted rows, every layer's keys then values (1, H, K, hd) with the
    first `count` valid, not yet in the buffers: the next pass writes them at `at`, its own
    offset minus `count`, before its own rows. K, one more than the deepest tree's depth, is
    the same for every pass of a generation (one trace per tree, whatever the last one was);
    the rows past `count` land at or past the next offset, where that pass's own rows or its
    mask cover them."""

    rows: list[mx.array]
    at: mx.array

    @classmethod
    def nothing(cls, caches: list, offset: mx.array, k: int) -> Kept:
        """Before the first pass: K rows of zeros per buffer at the offset, where the first
        pass writes its root."""
        rows = [mx.zeros((*x.shape[:2], k, x.shape[3]), x.dtype) for x in _states(caches)]
        return cls(rows, offset)

    def write(self, states: list) -> list:
        """`states` with these rows written in (in place: nothing else reads the old buffers)."""
        start = self.at[None]
        pairs = zip(states, self.rows, strict=True)
        return [mx.slice_update(x, r, start, axes=(2,)) for x, r in pairs]

    def commit(self, caches: list) -> None:
        """Write these rows into the caches' buffers for good (the host takes them over)."""
        _put(caches, self.write(_states(caches)))


def reserve(caches: list, end: int) -> int:
    """Grow every cache's buffer to one capacity, a multiple of CAPACITY_STEP holding `end`
    rows (an upper bound of the rows the next passes write up to) and every buffer's rows;
    returns it. One for all: a pass's masks span the first buffer, and the buffers can differ
    (an eager pass grows the lower layers' mlx-lm caches by their own step, the MSA layers'
    by theirs)."""
    caps = [end] + [cache.keys.shape[2] for cache in caches]
    target = -(-max(caps) // CAPACITY_STEP) * CAPACITY_STEP
    for cache in caches:
        cap = cache.keys.shape[2]
        if target == cap:
            continue
        b, h, _, dk = cache.keys.shape
        pad_k = mx.zeros((b, h, target - cap, dk), cache.keys.dtype)
        pad_v = mx.zeros((b, h, target - cap, cache.values.shape[3]), cache.values.dtype)
        cache.keys = mx.concatenate([cache.keys, pad_k], axis=2)
        cache.values = mx.concatenate([cache.values, pad_v], axis=2)
    return caches[0].keys.shape[2]


def compilable(caches: list) -> bool:
    """Plain mlx-lm KV caches (not quantized), already holding the prompt."""
    return all(type(c).__name__ == "KVCache" and c.keys is not None for c in caches)


def tree_arrays(tree: Tree, params, n_streams: int) -> list[mx.array]:
    """A tree's shape as arrays, what a pass needs besides its tokens: depths (N,), ancestors
    (N, N) and, with streams, the MSA rows' view of the N nodes (R, N) and of the stream rows
    (R, N*g), R = N + N*g."""
    anc = tree.ancestors()
    arrays = [mx.array(tree.depths), mx.array(anc)]
    if params is None:
        return arrays
    full = msa_mask(anc, 0, n_streams, params.config.main_needs_streams)  # (R, N + N*g)
    n = len(tree)
    return arrays + [mx.array(full[:, :n]), mx.array(full[:, n:])]


def _buffer_mask(offset: mx.array, cap: int, cols: mx.array) -> mx.array:
    """(R, cap): the prefix before `offset`, then this pass's N rows as `cols` (R, N) says."""
    n = cols.shape[1]
    rel = mx.arange(cap) - offset  # (cap,)
    inside = (rel >= 0) & (rel < n)
    seen = mx.take(cols, mx.clip(rel, 0, n - 1), axis=1)  # (R, cap)
    return (rel < 0)[None] | (inside[None] & seen)


@dataclass
class StepShape:
    """A static tree for `Passes.step`: its shape as arrays, made once per generation."""

    tree: Tree
    depth: int  # the tree's depth
    arrays: list[mx.array]  # tree_arrays
    static: list[mx.array]  # gather, parents, paths (policy.StaticShape)

    @classmethod
    def of(cls, shape: StaticShape, params, n_streams: int) -> StepShape:
        static = [mx.array(shape.gather), mx.array(shape.parents), mx.array(shape.paths)]
        return cls(shape.tree, shape.depth, tree_arrays(shape.tree, params, n_streams), static)


class Passes:
    """The passes of one model (with one StreamParams, or none: the model alone), compiled or
    eager, traces kept by shape. Owned by a decoding session, reused across generations."""

    def __init__(self, arch: Arch, params=None, compiled: bool = True):
        self.arch, self.params, self.compiled = arch, params, compiled
        self._fns: dict[tuple, object] = {}
        if params is not None:
            DraftVocab.of(arch, params)  # made before a trace reads it

    def logits(
        self,
        tree: Tree,
        caches: list,
        n_streams: int = 0,
        heads: str = "main",
        drafted: int | None = None,
    ):
        """Run `tree` (every node kept) at the caches' offset, for the host to read: returns
        (main logits (N, V), stream logits (N, drafted, V) of the first `drafted` streams
        (default all) for heads="one", stream hidden (N, g, d) for "split", None for "main").
        The caches hold the N new rows after it."""
        offset = caches[0].offset
        cap = reserve(caches, offset + len(tree))
        drafted = n_streams if drafted is None or heads != "one" else drafted
        key = ("logits", len(tree), n_streams, heads, drafted, cap)
        fn = self._fn(key, lambda: self._logits_fn(n_streams, heads, drafted))
        shape = tree_arrays(tree, self.params, n_streams)
        main, extra, *states = fn(mx.array(tree.tokens), mx.array(offset), shape, *_states(caches))
        _put(caches, states)
        for cache in caches:
            cache.offset = offset + len(tree)
        return main, extra

    def next_logits(self, shape: StepShape, state, n_streams: int) -> mx.array:
        """Plain decoding's pass from `state` (root and offset: arrays, maybe still lazy): the
        (V,) logits after the root; the offset moves on by one."""
        cap = reserve(state.caches, state.bound + 1)
        key = ("logits", 1, n_streams, "main", n_streams, cap)
        fn = self._fn(key, lambda: self._logits_fn(n_streams, "main", 0))
        inputs = [state.root.reshape(1), state.offset, shape.arrays]
        main, _, *states = fn(*inputs, *_states(state.caches))
        _put(state.caches, states)
        state.offset = state.offset + 1
        state.bound += 1
        return main[0]

    def step(self, shape: StepShape, state, n_streams: int, draft: tuple[int, int], gates=None):
        """One greedy pass of a static tree from `state` (root, drafts, offset: arrays, maybe
        still lazy; caches), accepted on the device. `draft` = (streams, top_k) drafted from
        the accepted node. Returns (tokens (D + 1,), count): the accepted path's tokens and the
        correction, the first `count` valid. `state` is advanced in place, lazily; with `gates`
        (an array of ascending confidences) `state.level` becomes the bin of stream 1's
        confidence at the accepted node, which picks the next pass's tree."""
        gated = gates is not None
        kept = state.kept  # Kept.nothing(...) before the first pass
        held = kept.rows[0].shape[2]
        # MLX does not bound-check slice updates: the buffers must hold this pass's rows and
        # the kept ones (written at the last offset, at most the bound)
        cap = reserve(state.caches, state.bound + max(len(shape.tree), held))
        vocab = state.vocab  # the streams draft over it (None: the whole head)
        k_vocab = None if vocab is None else vocab.ids.shape[0]
        key = ("step", len(shape.tree), shape.depth, n_streams, draft, gated, k_vocab, held, cap)
        fn = self._fn(
            key, lambda: self._step_fn(len(shape.tree), shape.depth, n_streams, draft, gated)
        )
        inputs = [state.root, state.drafts, state.offset, shape.arrays, shape.static]
        inputs += [gates] if gated else []
        inputs += [[vocab.ids, vocab.columns] if vocab is not None else []]
        inputs += [kept.at, kept.rows]
        tokens, count, state.root, state.drafts, at, *rest = fn(*inputs, *_states(state.caches))
        if gated:
            state.level, *rest = rest
        n = 2 * len(state.caches)
        _put(state.caches, rest[:n])
        state.kept = Kept(rest[n:], state.offset)
        state.offset = at
        state.bound += shape.depth + 1
        return tokens, count

    def _fn(self, key: tuple, make):
        fn = self._fns.pop(key, None)
        if fn is None:
            fn = mx.compile(make()) if self.compiled else make()
        self._fns[key] = fn  # most recently used last
        while len(self._fns) > MAX_TRACES:
            self._fns.pop(next(iter(self._fns)))
        return fn

    def _forward(self, tokens, offset, shape: list, states: list, n_streams: int):
        """Every layer over the N tokens: (main rows' normed hidden (N, d), stream rows' hidden
        (N, g, d) or None, each layer's _BufferCache holding its new buffers and rows)."""
        arch, params = self.arch, self.params
        n_layers, n = len(arch.layers), tokens.shape[0]
        n_low = n_layers if params is None else n_layers - params.config.n_msa_layers
        keys, values = states[:n_layers], states[n_layers:]
        caches = [_BufferCache(k, v, offset) for k, v in zip(keys, values, strict=True)]
        cap = keys[0].shape[2]
        depths, anc = shape[0], shape[1]
        h = arch.embed(tokens[None])  # (1, N, d)
        low_mask = _buffer_mask(offset, cap, anc)  # (N, cap)
        with arch.positions(depths + offset):
            for layer, cache in zip(arch.layers[:n_low], caches[:n_low], strict=True):
                h = layer(h, low_mask, cache)
        streams = None
        if params is not None:
            mask = mx.concatenate([_buffer_mask(offset, cap, shape[2]), shape[3]], axis=1)
            x = msa_layers(arch, params, h, MsaRows(depths, offset, mask), caches, n_streams)
            h = x[:, :n]
            streams = x[0, n:].reshape(n, n_streams, -1) if n_streams else None
        return arch.norm(h[0]), streams, caches

    def _heads(self, main, streams, drafted: int):
        """Main logits (N, V) and, with `drafted` > 0, the first `drafted` streams' logits
        (N, drafted, V) from one head pass (the head's weights read once; the streams nothing
        drafts from skip it)."""
        arch = self.arch
        if not drafted:
            return arch.lm_head(main), None
        n = streams.shape[0]
        rows = mx.concatenate([main, arch.norm(streams[:, :drafted].reshape(n * drafted, -1))])
        logits = arch.lm_head(rows)  # (N(1+drafted), V)
        return logits[:n], logits[n:].reshape(n, drafted, -1)

    def _logits_fn(self, n_streams: int, heads: str, drafted: int):
        def run(tokens, offset, shape, *states):
            main, streams, caches = self._forward(tokens, offset, shape, states, n_streams)
            new_states = [c.keys for c in caches] + [c.values for c in caches]
            drafted_here = drafted if heads == "one" else 0
            main_logits, together = self._heads(main, streams, drafted_here)
            extra = together if heads == "one" else streams if heads == "split" else None
            return main_logits, extra, *new_states

        return run

    def _step_fn(self, n: int, depth: int, n_streams: int, draft: tuple[int, int], gated: bool):
        arch, params = self.arch, self.params
        draft_depth, k = draft

        def run(root, drafts, offset, shape, static, *rest):
            gates, rest = (rest[0], rest[1:]) if gated else (None, rest)
            vocab, kept_at, kept_rows, *states = rest
            vocab = DraftVocab(*vocab, params.draft.size) if vocab else None
            gather, parents, paths = static
            tokens = mx.concatenate([root.reshape(1), drafts.reshape(-1)[gather]])  # (N,)
            states = Kept(kept_rows, kept_at).write(states)
            main, streams, caches = self._forward(tokens, offset, shape, states, n_streams)
            one_pass = draft_depth > 0 and one_head_pass(params, n * (1 + draft_depth))
            main_logits, together = self._heads(main, streams, draft_depth if one_pass else 0)
            greedy = mx.argmax(main_logits, axis=-1)  # (N,)
            best, count = _accept(tokens, greedy, shape[1], shape[0], parents)
            path = paths[best]  # (D + 1,) root first, padded with `best`
            held = kept_rows[0].shape[2]  # K >= D + 1: the same for every pass
            kept_path = path
            if held > depth + 1:
                pad = mx.broadcast_to(path[-1:], (held - depth - 1,))
                kept_path = mx.concatenate([path, pad])
            ahead = mx.concatenate([path[1:], path[-1:]])
            out = mx.where(mx.arange(depth + 1) == count - 1, greedy[best], tokens[ahead])
            buffers = [c.keys for c in caches] + [c.values for c in caches]
            rows = [c.rows[0] for c in caches] + [c.rows[1] for c in caches]
            kept_rows = [mx.take(r, kept_path, axis=2) for r in rows]  # (1, H, K, hd)
            if draft_depth > 0:
                if one_pass:
                    at_best = together[best]  # (depth, V)
                else:  # the streams read the accepted node's own next token
                    hidden = streams[best, :draft_depth][None]
                    at_best = stream_logits(arch, params, hidden, greedy[best][None], vocab)[0]
                drafts = top_k_ids(at_best, k)  # (depth, k)
            moved = [out, count, greedy[best], drafts, offset + count]
            if gated:
                moved.append(confidence_level(at_best[0], gates))
            return *moved, *buffers, *kept_rows

        return run


def _accept(tokens, greedy, anc, depths, parents):
    """Greedy acceptance on the device: a node is accepted when every node on its path equals
    its parent's greedy token; the deepest accepted node is unique (siblings differ). Returns
    it and the number of tokens decided (its depth + 1)."""
    match = (tokens == greedy[parents]) | (mx.arange(tokens.shape[0]) == 0)  # (N,)
    accepted = mx.all(match[None, :] | ~anc, axis=1)  # (N,)
    best = mx.argmax(mx.where(accepted, depths, -1))
    return best, depths[best] + 1


def confidence(logits: mx.array) -> mx.array:
    """A stream's confidence: the probability of its top token, from its (V,) logits."""
    return mx.max(mx.softmax(logits.astype(mx.float32), axis=-1))


def confidence_level(logits: mx.array, gates: mx.array) -> mx.array:
    """The bin of the confidence among ascending `gates`: how many it reaches."""
    return mx.sum(confidence(logits) >= gates)


TOP_K_BLOCK = 128  # vocabulary columns per block in top_k_ids


def top_k_ids(logits: mx.array, k: int) -> mx.array:
    """(..., V) logits -> (..., k) best token ids per row, best first. Over a large vocabulary,
    in two rounds: the k blocks of TOP_K_BLOCK columns with the highest maxima hold the k best
    tokens, so only their k * TOP_K_BLOCK columns are partitioned (an argpartition over V
    costs ~3.4 ms a node's 4 streams on the dev CPU, this 0.4-0.7: a host-settled pass reads
    every node's)."""
    if k == 1:
        return mx.argmax(logits, axis=-1, keepdims=True)
    *lead, v = logits.shape
    if v % TOP_K_BLOCK or v // TOP_K_BLOCK < 4 * k:
        return _top_k(logits, None, k)
    blocks = logits.reshape(*lead, v // TOP_K_BLOCK, TOP_K_BLOCK)
    best = _top_k(mx.max(blocks, axis=-1), None, k)  # (..., k) block indices
    columns = mx.take_along_axis(blocks, best[..., None], axis=-2).reshape(*lead, -1)
    ids = (best[..., None] * TOP_K_BLOCK + mx.arange(TOP_K_BLOCK, dtype=mx.uint32)).reshape(
        *lead, -1
    )
    return _top_k(columns, ids, k)


def _top_k(logits: mx.array, ids: mx.array | None, k: int) -> mx.array:
    """The `ids` (None: the positions) of each row's k largest `logits`, largest first."""
    top = mx.argpartition(-logits, k - 1, axis=-1)[..., :k]  # unordered
    order = mx.argsort(-mx.take_along_axis(logits, top, axis=-1), axis=-1)
    top = mx.take_along_axis(top, order, axis=-1)
    if ids is None:
        return top
    return mx.take_along_axis(mx.broadcast_to(ids, logits.shape), top, axis=-1)


def _states(caches: list) -> list[mx.array]:
    return [c.keys for c in caches] + [c.values for c in caches]


def _put(caches: list, states: list) -> None:
    k = len(caches)
    for i, cache in enumerate(caches):
        cache.keys, cache.values = states[i], states[k + i]
