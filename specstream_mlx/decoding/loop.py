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
  back, accepted in numpy and the caches compacted to the accepted path: decoding.host's
  framework-free runner over this module's `MlxForward` (the PyTorch path runs the same
  runner over its own tensor forward).

Grafted lookup (`ss+pld`, greedy) moves between the two: a pass the lookup grafts nothing
onto settles on the device, one it grafts onto on the host (`Grafting`).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from ..models.arch import Arch
from ..sampling import Sampler, SamplingParams, probabilities
from ..streams.params import StreamParams
from .host import Drafter, Drafting, DraftOverride, Grafter, HostRun, drive
from .kv import compact, rewind
from .passes import Kept, Passes, StepShape, compilable, confidence, top_k_ids
from .policy import StaticShape, TreePolicy
from .step import Step
from .tree import Tree
from .tree_step import DraftVocab, TreeOutput, one_head_pass, prefill_with_streams, tree_forward

PREFILL_CHUNK = 512  # prompt tokens per forward pass while prefilling: bounds activation memory
KV_GROUP_SIZE = 32  # for quantized KV caches; must divide the head dimension

__all__ = [
    "Decoder",
    "Drafter",
    "DraftOverride",
    "Prefill",
    "State",
    "decode",
    "decode_from",
    "make_cache",
    "prefilled",
]


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
    probe: list | None = None  # acceptance statistics (decoding.host.Drafting.probe)
    chain_streams: bool = True  # a pass verifying the drafter's chain runs the streams too
    graft: Grafter | None = None  # greedy: grows the streams' tree (prompt lookup's chains)
    stop: Callable[[], bool] | None = None  # asked between prefill chunks: True ends it there

    @property
    def n_streams(self) -> int:
        """Streams each node runs: lossless ones only as deep as the draft (stream j sees only
        streams 1..j, so the first ones do not change); shared mode all (the main stream
        attends to them); every one when probed."""
        if self.streams is None:
            return 0
        cfg = self.streams.config
        if cfg.main_needs_streams or self.probe is not None:
            return cfg.gamma
        return max(self.policy.depth, 1)

    @property
    def drafted(self) -> int:
        """Streams whose logits a pass reads: those the tree drafts from (every one when
        probed); the others run in the MSA layers only."""
        if self.streams is None:
            return 0
        if self.probe is not None:
            return self.n_streams
        return min(max(self.policy.depth, 1), self.n_streams)

    def drafting(self) -> Drafting:
        streams = self.streams is not None
        return Drafting(
            self.policy,
            streams,
            self.drafter,
            self.override,
            graft=self.graft,
            probe=self.probe,
            chain_streams=self.chain_streams,
        )


@dataclass
class State:
    """Where decoding stands (settled on the device, `root`, `drafts` and `offset` are arrays
    that may still be computing; `bound` is the host's upper bound of the offset)."""

    caches: list
    history: list[int]  # prompt and decided tokens, as far as read back
    root: int | mx.array  # the last decided token: the next tree's root
    drafts: list | mx.array | None = None  # the streams' proposals at the accepted node
    hidden: mx.array | None = None  # its normed last hidden state (drafters that read it)
    offset: mx.array | None = None
    bound: int = 0
    level: mx.array | None = None  # gated trees: the bin of stream 1's confidence at the root
    kept: Kept | None = None  # the last pass's accepted rows, not yet in the caches' buffers
    vocab: DraftVocab | None = None  # what the streams draft from (draft_vocab)


def decode(
    dec: Decoder, prompt_ids: list[int], max_tokens: int, sampling: SamplingParams | None = None
) -> Iterator[Step]:
    """Yield the tokens each forward pass decides until `max_tokens` are decided."""
    state = prefilled(dec, prompt_ids)
    if state is None:  # stopped while prefilling: no pass
        return
    yield from decode_from(dec, state, max_tokens, sampling)


def decode_from(
    dec: Decoder, state: State, max_tokens: int, sampling: SamplingParams | None = None
) -> Iterator[Step]:
    """`decode` from a prefilled `state` (its caches hold every token of its history but the
    last, its root). It uses `state` up: its caches and history move on as it decodes, so a
    state starts one generation."""
    sampling = sampling or SamplingParams()
    if not on_device(dec, state, sampling):
        run = HostRun(MlxForward(dec, state), dec.drafting(), state.history, sampling)
    elif dec.graft is not None:
        run = Grafting(dec, state, sampling)
    else:
        run = OnDevice(dec, state, sampling)
    yield from drive(run, max_tokens)


def on_device(dec: Decoder, state: State, sampling: SamplingParams) -> bool:
    """Whether passes can settle on the device: nothing drafted from outside, a tree that is
    never cut, greedy unless nothing is drafted, plain KV buffers. (A grafting generation's
    passes settle there only while the lookup grafts nothing: `Grafting`.)"""
    plain = dec.policy.depth == 0 or dec.streams is None
    static = plain or dec.policy.static_trees() is not None
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


def prefilled(dec: Decoder, prompt_ids: list[int]) -> State | None:
    """Caches holding every prompt token but the last, which is the first pass's root; None
    where `dec.stop` says to stop before one of its chunks (a long prompt's prefill takes
    minutes on a CPU: a server's client may have left)."""
    caches = make_cache(dec.model, dec.kv_bits)
    prefix = prompt_ids[:-1]
    with_streams = _prompt_streams(dec) is not None
    for start in range(0, len(prefix), PREFILL_CHUNK):
        if dec.stop is not None and dec.stop():
            return None
        piece = prefix[start : start + PREFILL_CHUNK]
        if with_streams:
            prefill_with_streams(dec.arch, dec.streams, piece, caches)
        else:
            dec.model(mx.array(piece)[None], cache=caches)
        mx.eval([c.state for c in caches])
    return State(caches, list(prompt_ids), prompt_ids[-1], vocab=draft_vocab(dec, prompt_ids))


def _prompt_streams(dec: Decoder) -> StreamParams | None:
    """The streams a prefill runs over the prompt (a shared adapter's main stream attends to
    them there), or None."""
    cfg = dec.streams.config if dec.streams is not None else None
    with_streams = cfg is not None and cfg.main_needs_streams and cfg.prompt_streams
    return dec.streams if with_streams else None


class Prefill:
    """A prompt prefilled once, rewound for each of many decoding loops that start from it (the
    latency curve's 90 timed loops: prefilling its 128 tokens for each took a quarter of its
    time, docs/BENCHMARKS.md, "A latency curve in three quarters of the time"). Decoding
    writes only past the prompt's tokens but the last (the first pass's root), so putting
    plain KV caches' offsets and capacities back gives a loop the start a fresh prefill
    would. A decoder whose prefill differs from the first one's (another model, quantized KV
    caches, streams run over the prompt), or caches that keep more than an offset (rotating
    ones), get a fresh prefill. The rewound states share one set of caches: their loops run
    one after another, never side by side."""

    def __init__(self, dec: Decoder, prompt: list[int]):
        if not prompt:
            raise ValueError("Prefill: an empty prompt (it needs at least its first token)")
        state = prefilled(dec, prompt)
        if state is None:
            raise ValueError("Prefill: the decoder's stop callback ended the prefill")
        self.dec, self.prompt, self.caches = dec, prompt, state.caches
        plain = compilable(self.caches)  # mlx-lm's KVCache: an offset into a buffer
        self.capacity = [c.keys.shape[2] for c in self.caches] if plain else None

    def state(self, dec: Decoder) -> State | None:
        """`dec`'s start: the prompt prefilled, nothing decided (None as `prefilled`'s)."""
        first = self.dec
        same = dec.model is first.model and dec.kv_bits == first.kv_bits
        if self.capacity is None or not same or _prompt_streams(dec) is not _prompt_streams(first):
            return prefilled(dec, self.prompt)
        rewind(self.caches, len(self.prompt) - 1, self.capacity)
        prompt = self.prompt
        return State(self.caches, list(prompt), prompt[-1], vocab=draft_vocab(dec, prompt))


def draft_vocab(dec: Decoder, prompt_ids: list[int]) -> DraftVocab | None:
    """The vocabulary the streams draft from in this generation (None: the whole head): their
    adapter's draft vocabulary, and the prompt's tokens where the streams draft (or are probed)
    and prompt lookup does not run (it drafts the prompt's spans itself; measured, the streams
    drafting them too lost 3% of `ss+pld`'s speed on two of three suites: BENCHMARKS.md)."""
    if dec.streams is None or dec.arch is None:
        return None
    vocab = DraftVocab.of(dec.arch, dec.streams)
    drafts = dec.policy.depth > 0 or dec.probe is not None
    if vocab is None or not drafts or dec.graft is not None or dec.drafter is not None:
        return vocab
    return vocab.with_prompt(dec.arch, prompt_ids)


@dataclass
class _Pending:
    tokens: mx.array  # (D + 1,) the accepted path's tokens and the correction
    count: mx.array | int  # how many of them are valid
    nodes: int  # the tree's size
    raised: int  # what issuing it added to the offset's upper bound


class OnDevice:
    """Passes settled on the device: plain decoding steps, or greedy passes of a static tree
    (or of one static tree per bin of stream 1's confidence). `issue` advances the state
    lazily, so the next pass is built before this one is read; a gated tree's next pass
    waits for this one's confidence instead."""

    def __init__(self, dec: Decoder, state: State, sampling: SamplingParams):
        self.dec, self.state = dec, state
        state.root = mx.array(state.root, dtype=mx.uint32)
        state.offset = mx.array(state.caches[0].offset, dtype=mx.int32)
        state.bound = state.caches[0].offset
        params, policy, n_streams = dec.streams, dec.policy, dec.n_streams
        self.sample, self.gates, self.trees = None, None, []
        plain = params is None or policy.depth == 0  # a shared model's plain decoding included
        self.draft = (0, 1) if plain else (policy.depth, policy.top_k)
        self.first = StepShape.of(StaticShape.of((), self.draft[1]), params, n_streams)
        if plain:
            self.sample = Sampler(sampling)
        else:
            self.trees = [
                StepShape.of(StaticShape.of(p, policy.top_k), params, n_streams)
                for p in policy.static_trees()
            ]
            if policy.gates:
                self.gates = mx.array(policy.gates, dtype=mx.float32)
        self.pipelined = self.gates is None
        state.drafts = mx.zeros(self.draft, dtype=mx.uint32)
        if self.trees:  # the accepted rows each pass keeps: as many as the deepest tree's path
            k = max(t.depth for t in self.trees) + 1
            state.kept = Kept.nothing(state.caches, state.offset, k)

    def issue(self) -> _Pending:
        dec, state = self.dec, self.state
        shape = self._shape()
        if self.sample is not None:
            logits = dec.passes.next_logits(shape, state, dec.n_streams)
            token = self.sample(logits)
            state.root = token.astype(mx.uint32)
            tokens, count = token.reshape(1), 1
        else:
            tokens, count = dec.passes.step(shape, state, dec.n_streams, self.draft, self.gates)
            self.first = None
        mx.async_eval(tokens, count, state.offset)
        return _Pending(tokens, count, len(shape.tree), shape.depth + 1)

    def _shape(self) -> StepShape:
        """This pass's tree: the root alone first (nothing drafted yet), then the static tree,
        or the tree of the bin the last pass's confidence fell in."""
        if self.sample is not None or self.first is not None:
            return self.first
        if self.gates is None:
            return self.trees[0]
        return self.trees[self.state.level.item()]

    def settle(self, pending: _Pending) -> Step:
        count = pending.count if isinstance(pending.count, int) else pending.count.item()
        tokens = pending.tokens.tolist()[:count]
        self.state.history.extend(tokens)
        self.state.bound -= pending.raised - count  # the bound, now that the count is known
        return Step(tokens, pending.nodes, pending.nodes)


class Grafting:
    """Greedy passes of a static tree with prompt lookup's chains grafted on (`ss+pld`): each
    pass settles on the device (OnDevice) while the lookup grafts nothing onto the streams'
    tree, and on the host (HostRun) when it does, the caches and the next draft handed over
    between them. Not pipelined: whether a pass grafts depends on the last one's tokens."""

    pipelined = False

    def __init__(self, dec: Decoder, state: State, sampling: SamplingParams):
        self.state, self.graft, self.gates = state, dec.graft, dec.policy.gates
        self.device = OnDevice(dec, state, sampling)
        self.root_alone = self.device.first  # the device's pass when nothing is drafted yet
        self.host = HostRun(MlxForward(dec, state), dec.drafting(), state.history, sampling)
        self.on_host = False

    def issue(self):
        tree = self.host.streams_tree()
        grafted, streams = self.graft(self.state.history, tree, self.host.confidence)
        if grafted == tree and streams:
            if self.on_host:
                self._to_device()
            return self.device.issue()
        if not self.on_host:
            self._to_host()
        return self.host.verify(grafted, len(grafted) - len(tree), None, streams)

    def settle(self, pending) -> Step:
        if not isinstance(pending, _Pending):
            return self.host.settle(pending)
        step = self.device.settle(pending)
        host, state = self.host, self.state  # the next draft, where the host can graft onto it
        host.root, host.drafts = state.history[-1], state.drafts.tolist()
        if self.gates:  # a confidence in the bin the device found
            level = state.level.item()
            host.confidence = self.gates[level - 1] if level else 0.0
        return step

    def _to_host(self) -> None:
        """The device's caches as the host keeps them: the last pass's accepted rows written
        into the buffers, the offset settled."""
        state = self.state
        state.kept.commit(state.caches)
        for cache in state.caches:
            cache.offset = state.bound  # exact: no pass is in flight
        self.on_host = True

    def _to_device(self) -> None:
        """The host's caches and next draft as the device's state."""
        state, host, device = self.state, self.host, self.device
        offset = state.caches[0].offset
        state.root = mx.array(host.root, dtype=mx.uint32)
        state.offset, state.bound = mx.array(offset, dtype=mx.int32), offset
        state.kept = Kept.nothing(state.caches, state.offset, state.kept.rows[0].shape[2])
        depth, k = device.draft
        device.first = None if host.drafts else self.root_alone
        if host.drafts:
            state.drafts = mx.array([c[:k] for c in host.drafts[:depth]], dtype=mx.uint32)
        if self.gates:
            state.level = mx.array(bisect.bisect_right(self.gates, host.confidence))
        self.on_host = False


class MlxForward:
    """decoding.host's Forward on MLX: compiled passes on the KV buffers where the tree cannot
    be cut, the eager tree step otherwise (pruning), the model alone for a family the tree
    passes do not know."""

    def __init__(self, dec: Decoder, state: State):
        self.dec, self.caches, self.vocab = dec, state.caches, state.vocab
        n_layers = len(dec.model.layers)
        self.n_low = n_layers if dec.streams is None else n_layers - dec.streams.config.n_msa_layers

    def offset(self) -> int:
        return self.caches[0].offset

    def verify(self, tree: Tree, prune: TreePolicy | None, drafts: bool) -> MlxVerified:
        dec, caches = self.dec, self.caches
        cuts = (
            prune is not None
            and len(tree) > 1
            and (len(tree) > prune.max_nodes or prune.prune_threshold > 0)
        )
        g = self._streams(drafts)
        if dec.passes is not None and not cuts and compilable(caches):
            out = self._compiled(tree, drafts, g)
        elif dec.arch is None:  # a family the tree passes do not know: mlx-lm's model, one token
            out = TreeOutput([0], dec.model(mx.array(tree.tokens)[None], cache=caches)[0], None)
        elif dec.streams is None:
            out = tree_forward(dec.arch, None, tree, caches)
        else:
            out = tree_forward(dec.arch, dec.streams, tree, caches, g, drafts, prune)
        return MlxVerified(out, dec.arch, dec.streams, self.vocab)

    def _streams(self, drafts: bool) -> int:
        """Streams each node runs in this pass: none where nothing is drafted from them and
        the main stream does not attend to them (lossless, not probed; a test's stand-in
        proposals keep them running, as the streams they stand in for would)."""
        dec = self.dec
        if drafts or dec.streams is None or dec.probe is not None or dec.override is not None:
            return dec.n_streams
        return dec.n_streams if dec.streams.config.main_needs_streams else 0

    def _compiled(self, tree: Tree, drafts: bool, g: int) -> TreeOutput:
        n, drafted = len(tree), self.dec.drafted
        heads = "main"
        if drafts:
            heads = "one" if one_head_pass(self.dec.streams, n * (1 + drafted)) else "split"
        main, extra = self.dec.passes.logits(tree, self.caches, g, heads, drafted)
        nodes = list(range(n))
        if heads == "one":
            return TreeOutput(nodes, main, None, extra)
        return TreeOutput(nodes, main, extra)

    def keep(self, offset: int, nodes: list[int], path: list[int]) -> None:
        compact_layers(self.caches, self.n_low, offset, nodes, path)


class MlxVerified:
    """decoding.host's Verified on MLX: a TreeOutput read back on demand."""

    def __init__(self, out: TreeOutput, arch: Arch, params: StreamParams | None, vocab):
        self.out, self.arch, self.params, self.survivors = out, arch, params, out.survivors
        self.vocab = vocab  # the streams' draft vocabulary (tree_step.DraftVocab) or None
        self._top: mx.array | None = None  # (M, g, k) every survivor's stream proposals

    def greedy(self, k: int) -> list[int]:
        argmax = mx.argmax(self.out.main_logits, axis=-1)
        if self.out.stream_logits is not None:  # read back in the same wait
            self._top = top_k_ids(self.out.stream_logits, k)
            mx.eval(argmax, self._top)
        return argmax.tolist()

    def target(self, sampling: SamplingParams):
        target = probabilities(self.out.main_logits, sampling)
        mx.eval(target)
        return lambda n: np.array(target[n])

    def stream_top(self, m: int, k: int) -> list[list[int]]:
        if self._top is not None:
            return self._top[m].tolist()
        return top_k_ids(self._streams(m), k).tolist()

    def stream_probs(self, m: int, depth: int, sampling: SamplingParams) -> np.ndarray:
        return np.array(probabilities(self._streams(m)[:depth], sampling))

    def stream_confidence(self, m: int) -> float:
        return confidence(self._streams(m)[0]).item()

    def _streams(self, m: int) -> mx.array:
        return self.out.streams_of(self.arch, self.params, m, self.vocab)

    def hidden(self, m: int):
        return None if self.out.main_hidden is None else self.out.main_hidden[m]


def compact_layers(caches, n_low: int, offset: int, nodes: list[int], path: list[int]) -> None:
    """Keep the accepted path in every layer: below the pruning point the caches hold every tree
    node (index = node), above it only the survivors (index = survivor position)."""
    compact(caches, offset, [nodes if i < n_low else path for i in range(len(caches))])
