"""The one decoding loop: a drafter proposes a tree, the verifier runs it in one forward pass,
the acceptor keeps the longest path the model agrees with, and the caches keep that path.

Every decoder is this loop (decoding.session builds the `Decoder` for each row of its table):
plain decoding drafts nothing, Speculative Streaming drafts from the streams of the last
accepted node, prompt lookup from the context, Medusa from its heads. A pass settles in one of
two places:

- on the device: plain decoding (greedy or sampled) and greedy decoding of a static tree. The
  whole pass, acceptance and the next draft included, is one graph over arrays
  (decoding.passes), so the loop queues the next pass before reading this one back: the
  host's work (reading, detokenizing, printing) overlaps the device's;
- on the host: drafts that need the decided text (prompt lookup, Medusa heads, a test oracle),
  trees that pruning may cut, tree rejection sampling, quantized KV caches. The pass is read
  back, accepted in numpy and the caches compacted to the accepted path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from ..models.arch import Arch
from ..sampling import Sampler, SamplingParams, probabilities
from ..streams.params import StreamParams
from .kv import compact
from .passes import Passes, StepShape, compilable, top_k_ids
from .plan import PROBE_TOP_K, sparse_tree
from .policy import StaticShape, TreePolicy
from .rejection import cap_breadth_first, draw_candidates, rng_for, verify_sampled
from .step import Step
from .tree import Tree, accept_greedy, draft_tree
from .tree_step import ONE_HEAD_PASS_ROWS, TreeOutput, prefill_with_streams, tree_forward

PREFILL_CHUNK = 512  # prompt tokens per forward pass while prefilling: bounds activation memory
KV_GROUP_SIZE = 32  # for quantized KV caches; must divide the head dimension

# A draft source besides the streams: (tokens decided so far, the normed last hidden state of
# the last one or None) -> the tree to verify, rooted at the last token (one node: no draft).
Drafter = Callable[[list[int], mx.array | None], Tree]
# Test hook: given the tokens decided so far, the tokens each stream should propose.
DraftOverride = Callable[[list[int]], list[list[int]]]


@dataclass
class Decoder:
    """What one generation decodes with, resolved once (decoding.session)."""

    model: nn.Module
    arch: Arch
    streams: StreamParams | None = None  # run in the MSA layers; None: the model alone
    policy: TreePolicy = TreePolicy()  # what the streams draft (depth 0: nothing)
    drafter: Drafter | None = None  # drafts from elsewhere; the streams' when it has none
    passes: Passes | None = None  # passes on KV buffers (compiled or not); None: mlx-lm's caches
    kv_bits: int | None = None  # quantized KV caches (4 or 8): passes settle on the host
    override: DraftOverride | None = None  # test hook: the streams' proposals, given the text
    probe: list | None = None  # acceptance statistics: (tokens decided, streams' top tokens)

    @property
    def n_streams(self) -> int:
        """Streams each node runs: lossless ones only as deep as the draft (stream j sees only
        streams 1..j, so the first ones do not change); shared mode all (the main stream
        attends to them); every one when probed."""
        if self.streams is None:
            return 0
        cfg = self.streams.config
        if cfg.mode == "shared" or self.probe is not None:
            return cfg.gamma
        return max(self.policy.depth, 1)


@dataclass
class State:
    """Where decoding stands. On the device `root`, `drafts` and `offset` are arrays that may
    still be computing; `bound` is the host's upper bound of the offset."""

    caches: list
    history: list[int]  # prompt and decided tokens, as far as read back
    root: int | mx.array  # the last decided token: the next tree's root
    drafts: list | mx.array | None = None  # the streams' proposals at the accepted node
    hidden: mx.array | None = None  # its normed last hidden state (drafters that read it)
    offset: mx.array | None = None
    bound: int = 0


def decode(
    dec: Decoder, prompt_ids: list[int], max_tokens: int, sampling: SamplingParams | None = None
) -> Iterator[Step]:
    """Yield the tokens each forward pass decides until `max_tokens` are decided."""
    sampling = sampling or SamplingParams()
    state = prefilled(dec, prompt_ids)
    run = (
        OnDevice(dec, state, sampling)
        if on_device(dec, state, sampling)
        else OnHost(dec, state, sampling)
    )
    pending, decided = run.issue(), 0
    while True:
        ahead = run.issue() if run.pipelined and decided + 1 < max_tokens else None
        step = run.settle(pending)
        step.tokens = step.tokens[: max_tokens - decided]
        decided += len(step.tokens)
        yield step
        if decided >= max_tokens:
            return
        pending = ahead if ahead is not None else run.issue()


def on_device(dec: Decoder, state: State, sampling: SamplingParams) -> bool:
    """Whether every pass can settle on the device: nothing drafted from outside, a tree that
    is never cut, greedy unless nothing is drafted, plain KV buffers."""
    plain = dec.policy.depth == 0 or dec.streams is None
    static = plain or dec.policy.fixed_paths() is not None
    return (
        dec.passes is not None
        and dec.drafter is None
        and dec.override is None
        and dec.probe is None
        and static
        and (sampling.greedy or plain)
        and compilable(state.caches)
    )


def make_cache(model: nn.Module, kv_bits: int | None = None) -> list:
    """mlx-lm's per-layer KV caches, quantized to `kv_bits` (4 or 8) when given."""
    cache = make_prompt_cache(model)
    if kv_bits:
        cache = [c.to_quantized(group_size=KV_GROUP_SIZE, bits=kv_bits) for c in cache]
    return cache


def prefilled(dec: Decoder, prompt_ids: list[int]) -> State:
    """Caches holding every prompt token but the last, which is the first pass's root."""
    caches = make_cache(dec.model, dec.kv_bits)
    prefix = prompt_ids[:-1]
    cfg = dec.streams.config if dec.streams is not None else None
    if cfg is not None and cfg.mode == "shared" and cfg.prompt_streams:
        prefill_with_streams(dec.arch, dec.streams, prefix, caches, PREFILL_CHUNK)
    else:
        tokens = mx.array(prefix)
        for start in range(0, len(prefix), PREFILL_CHUNK):
            dec.model(tokens[None, start : start + PREFILL_CHUNK], cache=caches)
            mx.eval([c.state for c in caches])
    return State(caches, list(prompt_ids), prompt_ids[-1])


@dataclass
class _Pending:
    tokens: mx.array  # (D + 1,) the accepted path's tokens and the correction
    count: mx.array | int  # how many of them are valid
    nodes: int  # the tree's size
    raised: int  # what issuing it added to the offset's upper bound


class OnDevice:
    """Passes settled on the device: plain decoding steps, or greedy passes of a static tree.
    `issue` advances the state lazily, so the next pass is built before this one is read."""

    pipelined = True

    def __init__(self, dec: Decoder, state: State, sampling: SamplingParams):
        self.dec, self.state = dec, state
        state.root = mx.array(state.root, dtype=mx.uint32)
        state.offset = mx.array(state.caches[0].offset, dtype=mx.int32)
        state.bound = state.caches[0].offset
        params, policy, n_streams = dec.streams, dec.policy, dec.n_streams
        self.sample = None
        self.draft = (0, 1)
        if params is None or policy.depth == 0:  # plain decoding (a shared model's included)
            self.sample = Sampler(sampling)
            self.shapes = [StepShape.of(StaticShape.of((), 1), params, n_streams)]
        else:
            self.draft = (policy.depth, policy.top_k)
            paths = policy.fixed_paths()
            self.shapes = [
                StepShape.of(StaticShape.of(p, policy.top_k), params, n_streams)
                for p in ((), paths)
            ]
        state.drafts = mx.zeros(self.draft, dtype=mx.uint32)

    def issue(self) -> _Pending:
        dec, state = self.dec, self.state
        shape = self.shapes[0]
        if self.sample is not None:
            logits = dec.passes.next_logits(shape, state, dec.n_streams)
            token = self.sample(logits)
            state.root = token.astype(mx.uint32)
            tokens, count = token.reshape(1), 1
        else:
            tokens, count = dec.passes.step(shape, state, dec.n_streams, self.draft)
            self.shapes = self.shapes[-1:]  # after the first pass: the whole tree
        mx.async_eval(tokens, count, state.offset)
        return _Pending(tokens, count, len(shape.tree), shape.depth + 1)

    def settle(self, pending: _Pending) -> Step:
        count = pending.count if isinstance(pending.count, int) else pending.count.item()
        tokens = pending.tokens.tolist()[:count]
        self.state.history.extend(tokens)
        self.state.bound -= pending.raised - count  # the bound, now that the count is known
        return Step(tokens, pending.nodes, pending.nodes)


@dataclass
class _HostPass:
    tree: Tree
    out: TreeOutput
    offset: int
    q: list | None  # sampling: the distribution each depth's candidates were drawn from
    stream_top: mx.array | None = None  # (M, g, k) every survivor's stream proposals


class OnHost:
    """Passes read back and settled on the host: greedy or tree rejection sampling."""

    pipelined = False

    def __init__(self, dec: Decoder, state: State, sampling: SamplingParams):
        self.dec, self.state = dec, state
        self.sampling = None if sampling.greedy else sampling
        self.rng = rng_for(sampling.seed) if self.sampling is not None else None
        n_layers = len(dec.model.layers)
        self.n_low = n_layers if dec.streams is None else n_layers - dec.streams.config.n_msa_layers
        self.q: list | None = None

    # ---- drafter ----

    def _draft(self) -> tuple[Tree, int, list | None]:
        """The tree to verify, the nodes drafted from outside the streams (not cut by the node
        cap), and per depth the distribution its candidates were drawn from (None: fixed)."""
        dec, state, policy = self.dec, self.state, self.dec.policy
        if dec.drafter is not None:
            tree = dec.drafter(state.history, state.hidden)
            if len(tree) > 1 or dec.streams is None or policy.depth == 0:
                return tree, len(tree) - 1, [None] * len(tree)
        root, drafts = state.root, state.drafts or []
        if self.sampling is not None:
            tree = cap_breadth_first(draft_tree(root, drafts), policy.max_nodes)
            return tree, 0, self.q
        if policy.paths is not None:
            return sparse_tree(root, drafts, policy.paths), 0, None
        drafted = [c[: policy.top_k] for c in drafts[: policy.depth]]
        if policy.prune_threshold == 0 and all(len(c) == 1 for c in drafted):
            drafted = drafted[: policy.max_nodes - 1]  # a chain cut to N nodes keeps N - 1 levels
        return draft_tree(root, drafted), 0, None

    # ---- verifier ----

    def _verify(self, tree: Tree, extra: int) -> TreeOutput:
        dec, caches = self.dec, self.state.caches
        drafts = self._drafts_from_streams() and dec.override is None
        if self.sampling is not None:
            prune = None  # a cut would depend on the drawn tokens: the cap is breadth-first
        else:
            prune = replace(dec.policy, max_nodes=dec.policy.max_nodes + extra)
        cuts = (
            prune is not None
            and len(tree) > 1
            and (len(tree) > prune.max_nodes or prune.prune_threshold > 0)
        )
        if dec.passes is not None and not cuts and compilable(caches):
            return self._compiled(tree, drafts)
        if dec.arch is None:  # a family the tree passes do not know: mlx-lm's model, one token
            logits = dec.model(mx.array(tree.tokens)[None], cache=caches)[0]
            return TreeOutput([0], logits, None)
        if dec.streams is None:
            return tree_forward(dec.arch, None, tree, caches)
        return tree_forward(dec.arch, dec.streams, tree, caches, dec.n_streams, drafts, prune)

    def _compiled(self, tree: Tree, drafts: bool) -> TreeOutput:
        n, g = len(tree), self.dec.n_streams
        heads = "main"
        if drafts:
            heads = "one" if n * (1 + g) <= ONE_HEAD_PASS_ROWS else "split"
        main, extra = self.dec.passes.logits(tree, self.state.caches, g, heads)
        nodes = list(range(n))
        if heads == "one":
            return TreeOutput(nodes, main, None, extra)
        return TreeOutput(nodes, main, extra)

    # ---- the loop's two halves ----

    def issue(self) -> _HostPass:
        offset = self.state.caches[0].offset
        tree, extra, q = self._draft()
        out = self._verify(tree, extra)
        return _HostPass(tree, out, offset, q)

    def settle(self, p: _HostPass) -> Step:
        state = self.state
        if self.sampling is None:
            path, tokens = self._greedy(p)
        else:
            path, tokens = self._sampled(p)
        state.history.extend(tokens)
        state.root = tokens[-1]
        state.hidden = None if p.out.main_hidden is None else p.out.main_hidden[path[-1]]
        if self._drafts_from_streams():
            self._next_drafts(p, path[-1])
        return Step(tokens, len(p.tree), len(p.out.survivors))

    # ---- acceptors ----

    def _greedy(self, p: _HostPass) -> tuple[list[int], list[int]]:
        argmax = mx.argmax(p.out.main_logits, axis=-1)
        if p.out.stream_logits is not None:  # read back in the same wait as the verification
            p.stream_top = top_k_ids(p.out.stream_logits, self._top_k())
            mx.eval(argmax, p.stream_top)
        argmax = argmax.tolist()
        path = accept_greedy(p.tree, p.out.survivors, argmax)
        nodes = [p.out.survivors[m] for m in path]
        compact_layers(self.state.caches, self.n_low, p.offset, nodes, path)
        return path, [p.tree.tokens[n] for n in nodes[1:]] + [argmax[path[-1]]]

    def _sampled(self, p: _HostPass) -> tuple[list[int], list[int]]:
        target = probabilities(p.out.main_logits, self.sampling)
        mx.eval(target)
        q = p.q if p.q is not None else [None] * len(p.tree)
        path, token = verify_sampled(p.tree, lambda n: np.array(target[n]), q, self.rng)
        compact_layers(self.state.caches, self.n_low, p.offset, path, path)
        return path, [p.tree.tokens[n] for n in path[1:]] + [token]

    def _drafts_from_streams(self) -> bool:
        dec = self.dec
        return dec.streams is not None and (dec.policy.depth > 0 or dec.probe is not None)

    def _top_k(self) -> int:
        return (
            max(self.dec.policy.top_k, PROBE_TOP_K)
            if self.dec.probe is not None
            else self.dec.policy.top_k
        )

    def _next_drafts(self, p: _HostPass, m: int) -> None:
        """The streams' proposals at accepted survivor m, for the next tree."""
        dec, state, out = self.dec, self.state, p.out
        if self.sampling is not None:
            depth = dec.policy.depth
            q = np.array(probabilities(out.streams_of(dec.arch, m)[:depth], self.sampling))
            self.q = list(q)  # (depth, V): what each depth's candidates are drawn from
            state.drafts = [draw_candidates(q[j], dec.policy.top_k, self.rng) for j in range(depth)]
            return
        if dec.override is not None:
            state.drafts = dec.override(state.history)
        elif p.stream_top is not None:
            state.drafts = p.stream_top[m].tolist()
        else:
            state.drafts = top_k_ids(out.streams_of(dec.arch, m), self._top_k()).tolist()
        if dec.probe is not None:
            dec.probe.append((len(state.history), state.drafts))


def compact_layers(caches, n_low: int, offset: int, nodes: list[int], path: list[int]) -> None:
    """Keep the accepted path in every layer: below the pruning point the caches hold every tree
    node (index = node), above it only the survivors (index = survivor position)."""
    for i, cache in enumerate(caches):
        compact(cache, offset, nodes if i < n_low else path)
