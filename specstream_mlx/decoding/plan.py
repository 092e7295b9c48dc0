"""Static sparse draft trees chosen from measured acceptance and a device's latency curve (no MLX).

A tree is a set of rank paths: (i1, ..., ij) is the node at depth j holding the i_j-th best token
of stream j, under the node (i1, ..., i(j-1)). Its expected tokens per pass are 1 plus, summed
over its nodes, the probability that the node's whole path is accepted; those probabilities are
counted on real positions (`Acceptance`), so no independence between streams is assumed. For a
node count N the N most probable paths form the best tree of that size (a child is never more
probable than its parent), as in Medusa's optimal trees; the device's cost of a pass of that
tree then picks N and the depth (`choose_tree`).

Where the statistics are split by stream 1's confidence (`Acceptance.bins`), a tree per bin can
do better than one for every position: a deep tree where the streams are sure, the root alone
where they are not (`choose_gated`, beyond the paper; cf. EAGLE-2's confidence-shaped trees).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

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


def choose_gated(
    acceptance: Acceptance, pass_ms: Callable[[int, int], float], static: TreePlan
) -> TreePlan:
    """A tree per bin of stream 1's confidence, where that promises GATED_GAIN times the best
    single tree (`static`, chosen by choose_tree); `static` otherwise. Every pass then runs
    the streams its deepest bin drafts, so each streams depth is tried in turn; for one depth
    the trees maximising the expected tokens per ms over all bins are found by Dinkelbach's
    iteration (each bin's best tree at the current rate, then the rate those trees give)."""
    bins = acceptance.bins
    if not bins or min(b.positions for b in bins) < MIN_BIN_POSITIONS:
        return static
    shares = [b.positions / acceptance.positions for b in bins]
    best = None
    for depth in range(1, acceptance.gamma + 1):
        options = [_prefix_trees(b, depth) for b in bins]
        rate = static.expected_tokens / static.pass_ms
        for _ in range(32):
            chosen = [
                max(opts, key=lambda t: t[1] - rate * pass_ms(len(t[0]) + 1, depth))
                for opts in options
            ]
            tokens = math.fsum(w * t[1] for w, t in zip(shares, chosen, strict=True))
            ms = math.fsum(
                w * pass_ms(len(t[0]) + 1, depth) for w, t in zip(shares, chosen, strict=True)
            )
            if abs(tokens / ms - rate) < 1e-12:
                break
            rate = tokens / ms
        if best is None or tokens / ms > best[1] / best[2]:
            best = (chosen, tokens, ms)
    chosen, tokens, ms = best
    trees = tuple(t[0] for t in chosen)
    static_rate = static.expected_tokens / static.pass_ms
    need = max(GATED_GAIN * static_rate, static.min_gain / static.plain_ms)
    if not any(trees) or tokens / ms <= need:
        return static
    union = tuple(sorted({p for t in trees for p in t}, key=lambda p: (len(p), p)))
    return TreePlan(
        union,
        tokens,
        ms,
        static.plain_ms,
        static.candidates,
        static.min_gain,
        acceptance.gates,
        trees,
        tuple(shares),
    )


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
