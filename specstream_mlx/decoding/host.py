"""The decoding loop's framework-free half: drive passes, and settle a pass on the host.

`drive` is the loop itself (issue a pass, settle it, queue the next one before reading this one
back when the runner is pipelined). `HostRun` is the runner whose passes are read back and
settled here: the drafter proposes a tree (the streams of the last accepted node, a drafter
such as prompt lookup, a static tree), a `Forward` verifies it in one pass, the acceptor keeps
the longest path the model agrees with (greedy) or applies tree rejection sampling, and the
caches keep that path. A `Forward` is all a framework supplies: the MLX runtime's
(decoding.loop) and the PyTorch path's (convert/torch_streams.py) run this same code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from .plan import PROBE_TOP_K, sparse_tree
from .policy import TreePolicy
from .rejection import cap_breadth_first, draw_candidates, rng_for, verify_sampled
from .step import Step
from .tree import Tree, accept_greedy, draft_tree

# A draft source besides the streams: (tokens decided so far, the normed last hidden state of
# the last one or None) -> the tree to verify, rooted at the last token (one node: no draft).
Drafter = Callable[[list[int], object], Tree]
# Grafts onto the streams' tree: (tokens decided so far, the streams' tree, stream 1's confidence
# where the tree is gated) -> the tree to verify (decoding.lookup.lookup_grafter), which may
# also be a lookup chain instead of it, and whether the streams run in its pass (lossless
# streams may sit out a chain's).
Grafter = Callable[[list[int], Tree, float], tuple[Tree, bool]]
# Test hook: given the tokens decided so far, the tokens each stream should propose.
DraftOverride = Callable[[list[int]], list[list[int]]]


class Verified(Protocol):
    """One verified tree, read back on demand."""

    survivors: list[int]  # tree nodes that entered the MSA layers (the rest were pruned)

    def greedy(self, k: int) -> list[int]:
        """The main stream's argmax per survivor (read back with the streams' top k, when
        their logits came from the same pass)."""

    def target(self, sampling) -> Callable[[int], np.ndarray]:
        """Survivor -> the main stream's sampling distribution there."""

    def stream_top(self, m: int, k: int) -> list[list[int]]:
        """The top k tokens of each stream of survivor m."""

    def stream_probs(self, m: int, depth: int, sampling) -> np.ndarray:
        """(depth, V) sampling distributions of the first `depth` streams of survivor m."""

    def stream_confidence(self, m: int) -> float:
        """Stream 1's confidence at survivor m: the probability of its top token (asked for
        by gated trees and the acceptance probe only, which the PyTorch path does not run)."""

    def hidden(self, m: int):
        """Survivor m's normed last hidden state, or None (for drafters that read it)."""


class Forward(Protocol):
    """A framework's verifier over its own caches."""

    def offset(self) -> int:
        """Tokens in the caches: where the next tree goes."""

    def verify(self, tree: Tree, prune: TreePolicy | None, drafts: bool) -> Verified:
        """Run `tree` after the cached tokens; `prune` (None: never) may cut it first with
        the early-exit head; `drafts`: the streams' logits will be drafted from."""

    def keep(self, offset: int, nodes: list[int], path: list[int]) -> None:
        """Keep the accepted path in the caches: `nodes` as tree nodes (the layers below the
        pruning point, which cached every node), `path` as survivors (the MSA layers)."""


@dataclass
class Drafting:
    """What is drafted each pass."""

    policy: TreePolicy = TreePolicy()  # the streams' tree (depth 0: nothing from the streams)
    streams: bool = False  # streams run (and can draft where the policy says so)
    drafter: Drafter | None = None  # drafts from elsewhere; the streams' when it has none
    override: DraftOverride | None = None  # test hook: the streams' proposals, given the text
    graft: Grafter | None = None  # greedy: grows the streams' tree (prompt lookup's chains)
    # acceptance statistics: (tokens decided, streams' top tokens, stream 1's confidence)
    probe: list | None = None
    # A pass verifying the drafter's tree (or a grafted one) runs the streams too, so the next
    # pass can draft from them; False: lossless streams sit such passes out (the next one
    # drafts nothing but the drafter's, or runs the root alone with the streams)
    chain_streams: bool = True

    @property
    def from_streams(self) -> bool:
        return self.streams and (self.policy.depth > 0 or self.probe is not None)


def drive(run, max_tokens: int) -> Iterator[Step]:
    """The loop: yield the tokens each pass decides until `max_tokens` are decided. A
    pipelined runner's next pass is issued before this one is read back."""
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


@dataclass
class _HostPass:
    tree: Tree
    out: Verified
    offset: int
    q: list | None  # sampling: the distribution each depth's candidates were drawn from
    streams: bool  # the streams ran, to be drafted from


class HostRun:
    """Passes read back and settled on the host: greedy or tree rejection sampling."""

    pipelined = False

    def __init__(self, forward: Forward, drafting: Drafting, history: list[int], sampling):
        self.forward, self.drafting = forward, drafting
        self.history, self.root = history, history[-1]  # prompt and decided tokens; next root
        self.drafts: list = []  # the streams' proposals at the last accepted node
        self.hidden = None  # its normed last hidden state
        self.confidence = 0.0  # stream 1's there (read where a gated tree or the probe needs it)
        self.sampling = None if sampling.greedy else sampling
        self.rng = rng_for(sampling.seed) if self.sampling is not None else None
        self.q: list | None = None

    def issue(self) -> _HostPass:
        return self.verify(*self._draft())

    def verify(
        self, tree: Tree, extra: int = 0, q: list | None = None, streams: bool = True
    ) -> _HostPass:
        """Issue the pass over `tree` (`extra`: its nodes drafted from outside the streams; `q`:
        per depth the distribution its candidates were drawn from; `streams` False: the
        streams sit this pass out, the next drafting nothing from them)."""
        offset = self.forward.offset()
        d = self.drafting
        prune = None  # sampling: a cut would depend on the drawn tokens (the cap is breadth-first)
        if self.sampling is None:
            prune = replace(d.policy, max_nodes=d.policy.max_nodes + extra)
        streams = streams and d.from_streams
        streams = streams and (extra == 0 or d.chain_streams or d.probe is not None)
        out = self.forward.verify(tree, prune, streams and d.override is None)
        return _HostPass(tree, out, offset, q, streams)

    def settle(self, p: _HostPass) -> Step:
        path, tokens = self._greedy(p) if self.sampling is None else self._sampled(p)
        self.history.extend(tokens)
        self.root = tokens[-1]
        self.hidden = p.out.hidden(path[-1])
        if p.streams:
            self._next_drafts(p, path[-1])
        else:  # nothing from the streams for the next pass
            self.drafts, self.q = [], None
        return Step(tokens, len(p.tree), len(p.out.survivors))

    # ---- drafter ----

    def _draft(self) -> tuple[Tree, int, list | None, bool]:
        """The tree to verify, the nodes drafted from outside the streams (not cut by the node
        cap), per depth the distribution its candidates were drawn from (None: fixed), and
        whether the streams run in its pass (the grafter may have them sit a chain's out)."""
        d, policy = self.drafting, self.drafting.policy
        if d.drafter is not None:
            tree = d.drafter(self.history, self.hidden)
            if len(tree) > 1 or not d.streams or policy.depth == 0:
                return tree, len(tree) - 1, [None] * len(tree), True
        if self.sampling is not None:
            tree = cap_breadth_first(draft_tree(self.root, self.drafts), policy.max_nodes)
            return tree, 0, self.q if self.drafts else None, True
        tree = self.streams_tree()
        if d.graft is None:
            return tree, 0, None, True
        grafted, streams = d.graft(self.history, tree, self.confidence)
        return grafted, len(grafted) - len(tree), None, streams

    def streams_tree(self) -> Tree:
        """Greedy: the streams' tree at the last accepted node (the root alone where they
        drafted nothing for this pass)."""
        policy = self.drafting.policy
        if not self.drafts:
            return draft_tree(self.root, [])
        paths = policy.paths_at(self.confidence)
        if paths is not None:
            return sparse_tree(self.root, self.drafts, paths)
        drafted = [c[: policy.top_k] for c in self.drafts[: policy.depth]]
        if policy.prune_threshold == 0 and all(len(c) == 1 for c in drafted):
            drafted = drafted[: policy.max_nodes - 1]  # a chain cut to N nodes keeps N - 1 levels
        return draft_tree(self.root, drafted)

    # ---- acceptors ----

    def _greedy(self, p: _HostPass) -> tuple[list[int], list[int]]:
        argmax = p.out.greedy(self._top_k())
        path = accept_greedy(p.tree, p.out.survivors, argmax)
        nodes = [p.out.survivors[m] for m in path]
        self.forward.keep(p.offset, nodes, path)
        return path, [p.tree.tokens[n] for n in nodes[1:]] + [argmax[path[-1]]]

    def _sampled(self, p: _HostPass) -> tuple[list[int], list[int]]:
        q = p.q if p.q is not None else [None] * len(p.tree)
        path, token = verify_sampled(p.tree, p.out.target(self.sampling), q, self.rng)
        self.forward.keep(p.offset, path, path)  # nothing is pruned while sampling
        return path, [p.tree.tokens[n] for n in path[1:]] + [token]

    def _top_k(self) -> int:
        k = self.drafting.policy.top_k
        return max(k, PROBE_TOP_K) if self.drafting.probe is not None else k

    def _next_drafts(self, p: _HostPass, m: int) -> None:
        """The streams' proposals at accepted survivor m, for the next tree."""
        d = self.drafting
        if self.sampling is not None:
            depth = d.policy.depth
            q = p.out.stream_probs(m, depth, self.sampling)
            self.q = list(q)  # (depth, V): what each depth's candidates are drawn from
            self.drafts = [draw_candidates(q[j], d.policy.top_k, self.rng) for j in range(depth)]
            return
        if d.override is not None:
            self.drafts = d.override(self.history)
        else:
            self.drafts = p.out.stream_top(m, self._top_k())
        if d.policy.gates or d.probe is not None:
            self.confidence = p.out.stream_confidence(m)
        if d.probe is not None:
            d.probe.append((len(self.history), self.drafts, self.confidence))
