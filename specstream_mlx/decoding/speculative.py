"""Speculative Streaming decoding (lossless, greedy or sampled): each forward pass verifies the
previous tree draft and drafts the next one from the streams of the last accepted node."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..models.arch import Arch
from ..sampling import SamplingParams, probabilities
from ..streams.params import StreamParams
from .compiled import CompiledPasses, compilable
from .kv import compact
from .lookup import LookupConfig, lookup_draft
from .plain import PREFILL_CHUNK, make_cache
from .plan import PROBE_TOP_K, sparse_tree
from .rejection import cap_breadth_first, draw_candidates, rng_for, verify_sampled
from .step import Step
from .tree import Tree, accept_greedy, draft_depth, draft_tree
from .tree_step import (
    ONE_HEAD_PASS_ROWS,
    TreeOutput,
    prefill_with_streams,
    tree_forward,
    verify_forward,
)

# Test hook: given the tokens decided so far, the tokens each stream should propose.
DraftOverride = Callable[[list[int]], list[list[int]]]
# A draft source without streams: (tokens decided so far, the normed last hidden state of the
# last one, None before the first pass) -> the tree to verify, rooted at the last token.
Drafter = Callable[[list[int], mx.array | None], Tree]


def speculative_decode(
    model: nn.Module,
    arch: Arch,
    params: StreamParams | None,
    prompt_ids: list[int],
    max_tokens: int,
    draft_override: DraftOverride | None = None,
    kv_bits: int | None = None,
    draft: bool = True,
    drafter: Drafter | None = None,
    lookup: LookupConfig | None = None,
    sampling: SamplingParams | None = None,
    probe: list | None = None,
    compiled: bool = False,
) -> Iterator[Step]:
    """Yield the tokens each forward pass accepts until `max_tokens` are decided.

    Greedy unless `sampling` has a temperature: then the drafts are drawn from the streams'
    distributions and verified by recursive rejection sampling (decoding.rejection), so the
    tokens are distributed exactly as plain sampling's.

    draft=False never drafts (one token per pass, streams still computed): plain decoding of a
    shared-mode model, whose main stream attends to its own streams. params=None runs no streams:
    the model verifies the trees `drafter` proposes (prompt lookup, Medusa heads). `lookup` drafts
    with prompt lookup (decoding.lookup) whenever the context has a match, and with the streams
    otherwise: copied text is drafted many tokens deep, the streams draft the rest.

    `probe` (greedy, lossless or shared) collects acceptance statistics: each pass appends
    (tokens decided so far, every stream's PROBE_TOP_K best tokens at the accepted node), which
    decoding.plan.ranks_of turns into rank rows once the continuation is known.

    compiled=True runs each pass that prunes nothing as one compiled graph (decoding.compiled;
    the same tokens, fewer dispatched operations)."""
    sampled = sampling is not None and not sampling.greedy
    if params is None:
        if drafter is None:
            raise ValueError("without streams the drafts must come from a drafter")
        yield from _verify_drafts(
            model, arch, prompt_ids, max_tokens, drafter, kv_bits, sampling if sampled else None
        )
        return
    if sampled:
        if draft_override is not None:
            raise ValueError("draft_override is for greedy decoding")
        yield from _sampled(
            model, arch, params, prompt_ids, max_tokens, kv_bits, draft, lookup, sampling
        )
        return
    cfg = params.config
    n_low = len(arch.layers) - cfg.n_msa_layers
    caches = _prefilled(model, arch, params, prompt_ids, kv_bits)
    depth = draft_depth(cfg) if draft else cfg.gamma
    # Lossless streams beyond the draft's depth are never used: they are not computed (unless
    # probed: then every stream's proposals are counted).
    n_streams = max(depth, 1) if cfg.mode == "lossless" else cfg.gamma
    top_k = cfg.top_k
    if probe is not None:
        n_streams, top_k = cfg.gamma, max(top_k, PROBE_TOP_K)
    passes = compiled_passes(arch, params) if compiled and compilable(caches) else None
    root, stream_tokens, decided = prompt_ids[-1], [], 0
    history = list(prompt_ids)
    while decided < max_tokens:
        copied = lookup_draft(history, lookup) if lookup is not None and draft else []
        # A lookup match replaces the streams' draft: a chain runs the cheap causal path, and
        # on a CPU a wider tree costs more than the streams' branch gains (docs/BENCHMARKS.md).
        if copied:
            tree = draft_tree(root, [[t] for t in copied])
        elif cfg.tree is not None:  # the static tree chosen for this device
            tree = sparse_tree(root, stream_tokens, cfg.tree)
        else:
            drafted = [c[: cfg.top_k] for c in stream_tokens[:depth]]
            if cfg.prune_threshold == 0 and all(len(c) == 1 for c in drafted):
                # pruning a chain to N nodes keeps its first N - 1 levels: draft only those
                drafted = drafted[: cfg.max_tree_nodes - 1]
            tree = draft_tree(root, drafted)
        offset = caches[0].offset
        own_drafts = draft and (depth > 0 or probe is not None) and draft_override is None
        extra = len(copied)  # the node cap is the streams': the lookup chain is not cut
        prunes = len(tree) > cfg.max_tree_nodes + extra or (
            len(tree) > 1 and cfg.prune_threshold > 0
        )
        if passes is not None and not prunes:
            out = _compiled_pass(passes, tree, caches, n_streams, own_drafts)
        else:
            out = tree_forward(arch, params, tree, caches, offset, n_streams, own_drafts, extra)
        argmax = mx.argmax(out.main_logits, axis=-1)
        # Every survivor's stream proposals in the same evaluation as the verification, when the
        # head pass produced them: one wait per pass instead of two.
        drafts = None
        if own_drafts and out.stream_logits is not None:
            drafts = top_k_ids(out.stream_logits, top_k)  # (M, gamma, k)
            mx.eval(argmax, drafts)
        argmax = argmax.tolist()
        path, tokens = _accept(tree, out.survivors, argmax, caches, n_low, offset)
        tokens = tokens[: max_tokens - decided]
        decided += len(tokens)
        history.extend(tokens)
        root = tokens[-1]
        if not draft or (depth == 0 and probe is None):
            stream_tokens = []
        elif draft_override is not None:
            stream_tokens = draft_override(history)
        elif drafts is not None:
            stream_tokens = drafts[path[-1]].tolist()
        else:
            stream_tokens = top_k_tokens(out.streams_of(arch, path[-1]), top_k)
        if probe is not None:
            probe.append((len(history), stream_tokens))
        yield Step(tokens, len(tree), len(out.survivors))


def compiled_passes(arch: Arch, params: StreamParams | None) -> CompiledPasses:
    """The compiled passes kept with the streams (or the model): traces are reused across
    generations."""
    owner = arch.embed if params is None else params
    passes = getattr(owner, "_compiled_passes", None)
    if passes is None or passes.arch.embed is not arch.embed:
        passes = CompiledPasses(arch, params)
        object.__setattr__(owner, "_compiled_passes", passes)  # not a module child
    return passes


def _compiled_pass(passes, tree: Tree, caches, n_streams: int, stream_logits: bool) -> TreeOutput:
    one_pass = stream_logits and len(tree) * (1 + n_streams) <= ONE_HEAD_PASS_ROWS
    main, extra = passes(tree, caches, n_streams, stream_logits, one_pass)
    survivors = list(range(len(tree)))
    if one_pass:
        return TreeOutput(survivors, main, None, extra)
    return TreeOutput(survivors, main, extra)


def _prefilled(model, arch: Arch, params: StreamParams, prompt_ids: list[int], kv_bits) -> list:
    """Caches holding every prompt token but the last (the first pass's root)."""
    caches = make_cache(model, kv_bits)
    cfg = params.config
    if cfg.mode == "shared" and cfg.prompt_streams:
        prefill_with_streams(arch, params, prompt_ids[:-1], caches, PREFILL_CHUNK)
    else:
        _prefill(model, prompt_ids[:-1], caches)
    return caches


def _sampled(
    model: nn.Module,
    arch: Arch,
    params: StreamParams,
    prompt_ids: list[int],
    max_tokens: int,
    kv_bits: int | None,
    draft: bool,
    lookup: LookupConfig | None,
    sampling: SamplingParams,
) -> Iterator[Step]:
    """speculative_decode with temperature: each depth's candidates are drawn without
    replacement from the streams' distribution (processed like the main stream's), the tree is
    cut breadth-first to the node cap (never by the pruning head: its cuts would depend on the
    drawn tokens) and verified by recursive rejection sampling."""
    cfg = params.config
    params = params.with_config(prune_threshold=0.0)
    n_low = len(arch.layers) - cfg.n_msa_layers
    caches = _prefilled(model, arch, params, prompt_ids, kv_bits)
    depth = draft_depth(params.config) if draft else 0
    n_streams = max(depth, 1) if cfg.mode == "lossless" else cfg.gamma
    rng = rng_for(sampling.seed)
    root, candidates, drafts, decided = prompt_ids[-1], [], [], 0
    history = list(prompt_ids)
    while decided < max_tokens:
        copied = lookup_draft(history, lookup) if lookup is not None and draft else []
        if copied:  # fixed tokens: point-mass drafts
            tree, drafts = draft_tree(root, [[t] for t in copied]), [None] * len(copied)
        else:
            tree = cap_breadth_first(draft_tree(root, candidates), cfg.max_tree_nodes)
        offset = caches[0].offset
        out = tree_forward(arch, params, tree, caches, offset, n_streams, depth > 0, len(copied))
        assert out.survivors == list(range(len(tree)))  # nothing pruned: the shape is fixed
        target = probabilities(out.main_logits, sampling)
        mx.eval(target)
        path, token = verify_sampled(tree, lambda n, t=target: np.array(t[n]), drafts, rng)
        compact_layers(caches, n_low, offset, path, path)
        tokens = [tree.tokens[n] for n in path[1:]] + [token]
        tokens = tokens[: max_tokens - decided]
        decided += len(tokens)
        history.extend(tokens)
        root = tokens[-1]
        if depth > 0:
            q = np.array(probabilities(out.streams_of(arch, path[-1])[:depth], sampling))
            drafts = list(q)  # (depth, V): what each depth's candidates are drawn from
            candidates = [draw_candidates(q[j], cfg.top_k, rng) for j in range(depth)]
        yield Step(tokens, len(tree), len(tree))


def _verify_drafts(
    model: nn.Module,
    arch: Arch,
    prompt_ids: list[int],
    max_tokens: int,
    drafter: Drafter,
    kv_bits: int | None,
    sampling: SamplingParams | None = None,
) -> Iterator[Step]:
    """The model alone verifies each pass's drafted tree; no streams. With `sampling` (a
    temperature), the drafted tokens are fixed candidates verified by rejection sampling."""
    caches = make_cache(model, kv_bits)
    _prefill(model, prompt_ids[:-1], caches)
    history, hidden = list(prompt_ids), None
    rng = rng_for(sampling.seed) if sampling is not None else None
    decided = 0
    while decided < max_tokens:
        tree = drafter(history, hidden)
        offset = caches[0].offset
        out = verify_forward(arch, tree, caches, offset)
        if sampling is not None:
            target = probabilities(out.main_logits, sampling)
            mx.eval(target)
            path, token = verify_sampled(
                tree, lambda n, t=target: np.array(t[n]), [None] * len(tree), rng
            )
            compact_layers(caches, len(arch.layers), offset, path, path)
            tokens = [tree.tokens[n] for n in path[1:]] + [token]
        else:
            argmax = mx.argmax(out.main_logits, axis=-1).tolist()
            path, tokens = _accept(tree, out.survivors, argmax, caches, len(arch.layers), offset)
        hidden = out.main_hidden[path[-1]]
        tokens = tokens[: max_tokens - decided]
        decided += len(tokens)
        history.extend(tokens)
        yield Step(tokens, len(tree), len(tree))


def _accept(tree: Tree, survivors: list[int], argmax: list[int], caches, n_low: int, offset: int):
    """The accepted path (survivor positions, root first) and the tokens it decides (its nodes'
    tokens and the correction); the caches keep exactly that path."""
    path = accept_greedy(tree, survivors, argmax)
    nodes = [survivors[m] for m in path]
    compact_layers(caches, n_low, offset, nodes, path)
    return path, [tree.tokens[n] for n in nodes[1:]] + [argmax[path[-1]]]


def _prefill(model: nn.Module, tokens: list[int], caches: list) -> None:
    prefix = mx.array(tokens)
    for start in range(0, prefix.size, PREFILL_CHUNK):
        model(prefix[None, start : start + PREFILL_CHUNK], cache=caches)
        mx.eval([c.state for c in caches])


def top_k_tokens(logits: mx.array, k: int) -> list[list[int]]:
    """(gamma, V) logits -> each row's k best token ids, best first."""
    return top_k_ids(logits, k).tolist()


def top_k_ids(logits: mx.array, k: int) -> mx.array:
    """(..., V) logits -> (..., k) best token ids per row, best first (argpartition: O(V))."""
    if k == 1:
        return mx.argmax(logits, axis=-1, keepdims=True)
    top = mx.argpartition(-logits, k - 1, axis=-1)[..., :k]  # unordered
    order = mx.argsort(-mx.take_along_axis(logits, top, axis=-1), axis=-1)
    return mx.take_along_axis(top, order, axis=-1)


def compact_layers(caches, n_low: int, offset: int, nodes: list[int], path: list[int]) -> None:
    """Keep the accepted path in every layer: below the pruning point the caches hold every tree
    node (index = node), above it only the survivors (index = survivor position)."""
    for i, cache in enumerate(caches):
        compact(cache, offset, nodes if i < n_low else path)
