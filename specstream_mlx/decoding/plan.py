"""Static sparse draft trees chosen from measured acceptance and a device's latency curve (no MLX).

A tree is a set of rank paths: (i1, ..., ij) is the node at depth j holding the i_j-th best token
of stream j, under the node (i1, ..., i(j-1)). Its expected tokens per pass are 1 plus, summed
over its nodes, the probability that the node's whole path is accepted; those probabilities are
counted on real positions (`Acceptance`), so no independence between streams is assumed. For a
node count N the N most probable paths form the best tree of that size (a child is never more
probable than its parent), as in Medusa's optimal trees; the device's cost of a pass of that
tree then picks N and the depth (`choose_tree`).

Counting every position alike overstates what a tree gives: a decode's passes start only where
the last accepted path ended, and the positions inside accepted paths, skipped, are the easy
ones. Where the statistics keep their positions in order (`Acceptance.trace`) the planner walks
them as a decode would, pass by pass (`choose_walked`): the same trees, priced by what they
give on that walk. The walk also weighs a tree per bin of stream 1's confidence against one
tree for all (beyond the paper; EAGLE-2 shapes its trees by draft confidence too): a deep tree
where the streams are sure, the root alone where they are not.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ..streams.acceptance import ACCEPTANCE_FILE, PROBE_TOP_K, Acceptance, Path_, ranks_of
from .policy import TreePolicy
from .tree import Tree

__all__ = ["ACCEPTANCE_FILE", "PROBE_TOP_K", "Acceptance", "ranks_of", "choose_tree", "sparse_tree"]

MAX_PLAN_NODES = 64  # drafted nodes, root excluded
# A tree must promise this much over one token per pass: below it, timing noise (about 5-10%
# between runs on a shared machine) could make the "faster" tree the slower one. A latency curve
# whose own timings moved more than that while it was measured asks for more (plan_tree).
MIN_GAIN = 1.03
# Gated trees are chosen on the same positions they are scored on, one tree per bin: they must
# promise this much over the best single tree, and every bin must hold this many positions.
GATED_GAIN = 1.02
MIN_BIN_POSITIONS = 50
MAX_WALK_NODES = 16  # trees walked over a trace: up to this many nodes, root included


@dataclass(frozen=True)
class TreePlan:
    """A chosen static tree and why: its rank paths (parents first), expected tokens per pass,
    predicted pass cost and speed over plain decoding on this device."""

    paths: tuple[Path_, ...]
    expected_tokens: float
    pass_ms: float
    plain_ms: float
    candidates: list = field(default_factory=list, compare=False)  # (nodes, depth, speedup)
    min_gain: float = MIN_GAIN  # the speed over plain decoding a tree had to promise
    # gated: a tree per bin of stream 1's confidence (`paths` is then their union, and
    # expected_tokens and pass_ms the means over the bins' shares of positions)
    gates: tuple[float, ...] = ()
    bins: tuple[tuple[Path_, ...], ...] = ()
    shares: tuple[float, ...] = ()
    bin_tokens: tuple[float, ...] = ()  # per bin: tokens per pass drafting its tree

    @property
    def depth(self) -> int:
        return max((len(p) for p in self.paths), default=0)

    @property
    def nodes(self) -> int:
        return 1 + len(self.paths)

    @property
    def predicted_speedup(self) -> float:
        return self.expected_tokens / self.pass_ms * self.plain_ms

    def top_k(self) -> int:
        """Tokens needed from each stream: the largest rank drafted, plus one."""
        return 1 + max((max(p) for p in self.paths), default=0)

    def to_dict(self) -> dict:
        return {
            "paths": [list(p) for p in self.paths],
            "nodes": self.nodes,
            "depth": self.depth,
            "expected_tokens_per_pass": round(self.expected_tokens, 3),
            "predicted_pass_ms": round(self.pass_ms, 2),
            "predicted_plain_ms": round(self.plain_ms, 2),
            "predicted_speedup": round(self.predicted_speedup, 3),
            "required_speedup": round(self.min_gain, 3),
            **(
                {
                    "gates": list(self.gates),
                    "bin_trees": [[list(p) for p in paths] for paths in self.bins],
                    "bin_shares": [round(w, 3) for w in self.shares],
                    "bin_expected_tokens": [round(t, 3) for t in self.bin_tokens],
                }
                if self.bins
                else {}
            ),
        }

    def policy(self) -> TreePolicy:
        """What the decoder drafts: the static tree, or the gated trees."""
        if self.bins:
            return TreePolicy.gated(self.gates, self.bins)
        return TreePolicy.static(self.paths)


def best_paths(acceptance: Acceptance, max_depth: int, limit: int) -> list[Path_]:
    """The `limit` most probable paths no deeper than max_depth (ties: shallower, then smaller
    ranks), parents first."""
    paths = [p for p, n in acceptance.counts.items() if n > 0 and len(p) <= max_depth]
    paths.sort(key=lambda p: (-acceptance.counts[p], len(p), p))
    chosen = set()
    for p in paths:  # every parent is at least as frequent, so it came earlier
        if len(chosen) >= limit:
            break
        if len(p) == 1 or p[:-1] in chosen:
            chosen.add(p)
    return sorted(chosen, key=lambda p: (len(p), p))


def choose_tree(
    acceptance: Acceptance,
    pass_ms: Callable[[int, int], float],
    plain_ms: float,
    max_nodes: int = MAX_PLAN_NODES,
    min_gain: float = MIN_GAIN,
) -> TreePlan:
    """The tree with the most expected tokens per second: pass_ms(nodes, depth) is the predicted
    cost of one pass over a tree of `nodes` nodes (root included) whose streams draft `depth`
    levels. The empty tree is a candidate too: one token per pass at plain decoding's cost
    (plain_ms: the streams are then not run, or, in shared mode, plain decoding runs them). A
    tree is chosen over it only when it promises `min_gain` times its speed."""
    best = TreePlan((), 1.0, plain_ms, plain_ms)
    candidates = [(1, 0, round(best.predicted_speedup, 3))]
    for depth in range(1, acceptance.gamma + 1):
        ranked = best_paths(acceptance, depth, max_nodes)
        if not any(len(p) == depth for p in ranked):
            continue
        order = sorted(ranked, key=lambda p: (-acceptance.counts[p], len(p), p))
        expected = 1.0
        for n, path in enumerate(order, start=1):
            expected += acceptance.probability(path)
            chosen = order[:n]
            if max(len(p) for p in chosen) != depth:
                continue  # counted under a smaller depth, whose streams cost less
            plan = TreePlan(
                tuple(sorted(chosen, key=lambda p: (len(p), p))),
                expected,
                pass_ms(n + 1, depth),
                plain_ms,
            )
            candidates.append((n + 1, depth, round(plan.predicted_speedup, 3)))
            bar = best.predicted_speedup * (min_gain if not best.paths else 1.0)
            if plan.predicted_speedup > bar + 1e-9:
                best = plan
    return TreePlan(best.paths, best.expected_tokens, best.pass_ms, plain_ms, candidates, min_gain)


def choose_walked(
    acceptance: Acceptance,
    pass_ms: Callable[[int, int], float],
    plain_ms: float,
    min_gain: float = MIN_GAIN,
    gated_ms: float = 0.0,
) -> TreePlan:
    """choose_tree over the acceptance's trace (which it must have): each candidate tree priced
    by walking the trace pass by pass; then, where every confidence bin holds MIN_BIN_POSITIONS,
    a tree per bin, kept where it gives GATED_GAIN times the best single tree. Per streams depth
    the bins' trees are improved one bin at a time (each bin's candidates tried with the others
    fixed, twice over), starting from the best single tree. A pass of a tree per bin costs
    `gated_ms` more than pass_ms says: the loop cannot build it before the last pass's
    confidence is read back (a static tree's is built meanwhile: decoding.loop.OnDevice)."""
    walker = _Walker(acceptance, gated_ms)
    best = TreePlan((), 1.0, plain_ms, plain_ms)
    candidates = [(1, 0, 1.0)]
    for depth in range(1, acceptance.gamma + 1):
        for tree, _ in _prefix_trees(acceptance, depth)[1:MAX_WALK_NODES]:
            if max(len(p) for p in tree) != depth:
                continue  # counted under a smaller depth, whose streams cost less
            plan = walker.plan([tree] * walker.n_bins, depth, pass_ms, plain_ms)
            candidates.append((plan.nodes, depth, round(plan.predicted_speedup, 3)))
            bar = best.predicted_speedup * (min_gain if not best.paths else 1.0)
            if plan.predicted_speedup > bar + 1e-9:
                best = plan
    static = replace(best, candidates=candidates, min_gain=min_gain)
    bins = acceptance.bins
    if not bins or len(bins) < 2 or min(b.positions for b in bins) < MIN_BIN_POSITIONS:
        return static
    gated = static
    for depth in range(1, acceptance.gamma + 1):
        options = [[t for t, _ in _prefix_trees(b, depth)[:MAX_WALK_NODES]] for b in bins]
        start = tuple(p for p in static.paths if len(p) <= depth)
        trees = [start] * len(bins)
        plan = walker.plan(trees, depth, pass_ms, plain_ms)
        for _ in range(2):
            for b, opts in enumerate(options):
                for tree in opts:
                    other = [*trees[:b], tree, *trees[b + 1 :]]
                    tried = walker.plan(other, depth, pass_ms, plain_ms)
                    if tried.predicted_speedup > plan.predicted_speedup + 1e-9:
                        plan, trees = tried, other
        if plan.predicted_speedup > gated.predicted_speedup:
            gated = plan
    need = max(GATED_GAIN * static.predicted_speedup, min_gain)
    if not gated.bins or gated.predicted_speedup <= need:
        return static
    return replace(gated, candidates=candidates, min_gain=min_gain)


class _Walker:
    """A decode's passes over an acceptance trace: each pass starts where the last accepted path
    ended, drafts the tree of the bin its confidence falls in, and accepts the longest path
    of it that the recorded ranks follow."""

    def __init__(self, acceptance: Acceptance, gated_ms: float):
        trace = acceptance.trace
        self.gated_ms = gated_ms  # what each pass costs more where the bins' trees differ
        self.gates = acceptance.gates
        self.n_bins = len(self.gates) + 1
        self.level = np.searchsorted(self.gates, trace.confidence, side="right")
        self.prefixes = [_prefixes(row) for row in trace.ranks.tolist()]
        self.ends = [*trace.starts[1:], len(trace.ranks)]
        self.starts = trace.starts
        self._accepted: dict[tuple, list[int]] = {}

    def plan(self, trees: list, depth: int, pass_ms, plain_ms: float) -> TreePlan:
        """The plan drafting trees[b] in bin b, its streams `depth` deep: tokens and ms per pass
        over the walk (one tree for all: a static plan)."""
        accepted = [self._accepted_in(tuple(t)) for t in trees]
        cost = [pass_ms(1 + len(t), depth) for t in trees]
        tokens, passes = [0] * self.n_bins, [0] * self.n_bins
        ms = 0.0
        for start, end in zip(self.starts, self.ends, strict=True):
            p = start
            while p < end:
                b = self.level[p]
                step = accepted[b][p] + 1
                tokens[b] += min(step, end - p)
                ms += cost[b]
                passes[b] += 1
                p += step
        trees = tuple(tuple(t) for t in trees)
        total, decided = max(sum(passes), 1), sum(tokens)
        if len(set(trees)) == 1:
            return TreePlan(trees[0], decided / total, ms / total, plain_ms)
        ms += self.gated_ms * sum(passes)
        union = tuple(sorted({p for t in trees for p in t}, key=lambda p: (len(p), p)))
        shares = tuple(float(np.mean(self.level == b)) for b in range(self.n_bins))
        per_bin = tuple(t / n if n else 1.0 for t, n in zip(tokens, passes, strict=True))
        plan = TreePlan(union, decided / total, ms / total, plain_ms)
        return replace(plan, gates=self.gates, bins=trees, shares=shares, bin_tokens=per_bin)

    def _accepted_in(self, tree: tuple) -> list[int]:
        """Per position, the drafted tokens a pass of `tree` accepts there."""
        found = self._accepted.get(tree)
        if found is None:
            paths = set(tree)
            found = [sum(p in paths for p in pre) for pre in self.prefixes]
            self._accepted[tree] = found
        return found


def _prefixes(ranks: list[int]) -> list[Path_]:
    """A position's rank paths from stream 1 on, up to its first target not proposed."""
    out, path = [], ()
    for rank in ranks:
        if rank >= PROBE_TOP_K:
            break
        path += (rank,)
        out.append(path)
    return out


def _prefix_trees(acceptance: Acceptance, depth: int) -> list[tuple[tuple[Path_, ...], float]]:
    """The best tree of each size no deeper than `depth` (the root alone included), with its
    expected tokens per pass."""
    ranked = best_paths(acceptance, depth, MAX_PLAN_NODES)
    order = sorted(ranked, key=lambda p: (-acceptance.counts[p], len(p), p))
    trees, expected = [((), 1.0)], 1.0
    for n, path in enumerate(order, start=1):
        expected += acceptance.probability(path)
        trees.append((tuple(sorted(order[:n], key=lambda p: (len(p), p))), expected))
    return trees


def sparse_tree(root: int, stream_tokens: list[list[int]], paths: Sequence[Path_]) -> Tree:
    """The draft for `paths` (parents first): node (i1..ij) holds stream_tokens[j-1][ij]."""
    tokens, parents, depths = [root], [-1], [0]
    index: dict[Path_, int] = {(): 0}
    for path in paths:
        j, rank = len(path) - 1, path[-1]
        if j >= len(stream_tokens) or rank >= len(stream_tokens[j]):
            continue  # nothing drafted there (e.g. the first pass has no streams yet)
        parent = index.get(path[:-1])
        if parent is None:
            continue
        index[path] = len(tokens)
        tokens.append(stream_tokens[j][rank])
        parents.append(parent)
        depths.append(len(path))
    return Tree(tokens, parents, depths)


def expected_tokens(acceptance: Acceptance, paths: Sequence[Path_]) -> float:
    return 1.0 + math.fsum(acceptance.probability(p) for p in paths)
