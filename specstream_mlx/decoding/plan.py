"""Static sparse draft trees chosen from measured acceptance and a device's latency curve (no MLX).

A tree is a set of rank paths: (i1, ..., ij) is the node at depth j holding the i_j-th best token
of stream j, under the node (i1, ..., i(j-1)). Its expected tokens per pass are 1 plus, summed
over its nodes, the probability that the node's whole path is accepted; those probabilities are
counted on real positions (`Acceptance`), so no independence between streams is assumed. For a
node count N the N most probable paths form the best tree of that size (a child is never more
probable than its parent), as in Medusa's optimal trees; the device's cost of a pass of that
tree then picks N and the depth (`choose_tree`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import SpecstreamError
from .tree import Tree

Path_ = tuple[int, ...]
PROBE_TOP_K = 8  # ranks counted per stream; a target outside the top 8 ends its path
MAX_PLAN_NODES = 64  # drafted nodes, root excluded
# A tree must promise this much over one token per pass: below it, timing noise (about 5-10%
# between runs on a shared machine) could make the "faster" tree the slower one.
MIN_GAIN = 1.03
ACCEPTANCE_FILE = "acceptance.json"


@dataclass
class Acceptance:
    """How often the targets of gamma streams sat at each rank path, over `positions` positions.

    counts[(i1, ..., ij)] = positions where stream 1's target was its i1-th best token, ..., stream
    j's its ij-th best (ranks from 0, below PROBE_TOP_K)."""

    gamma: int
    positions: int
    counts: dict[Path_, int]
    source: str = ""

    @classmethod
    def from_ranks(cls, ranks: Sequence[Sequence[int]], gamma: int, source: str = ""):
        """ranks: per position, the rank of each stream's target (>= PROBE_TOP_K: not drafted)."""
        counts: dict[Path_, int] = {}
        for row in ranks:
            path: Path_ = ()
            for rank in list(row)[:gamma]:
                if rank >= PROBE_TOP_K:
                    break
                path += (int(rank),)
                counts[path] = counts.get(path, 0) + 1
        return cls(gamma, len(ranks), counts, source)

    def probability(self, path: Path_) -> float:
        return self.counts.get(path, 0) / self.positions if self.positions else 0.0

    def to_dict(self) -> dict:
        return {
            "format_version": 1,
            "gamma": self.gamma,
            "top_k": PROBE_TOP_K,
            "positions": self.positions,
            "source": self.source,
            "counts": {".".join(map(str, p)): n for p, n in sorted(self.counts.items())},
        }

    @classmethod
    def from_dict(cls, data: dict) -> Acceptance:
        try:
            counts = {
                tuple(int(r) for r in k.split(".")): int(v) for k, v in data["counts"].items()
            }
            out = cls(
                int(data["gamma"]), int(data["positions"]), counts, str(data.get("source", ""))
            )
        except (KeyError, ValueError, TypeError, AttributeError) as exc:
            raise SpecstreamError(f"bad acceptance statistics: {exc!r}") from None

        def fits(p: Path_) -> bool:
            parent = out.positions if len(p) == 1 else counts.get(p[:-1], -1)
            return len(p) <= out.gamma and min(p) >= 0 and 0 <= counts[p] <= parent

        if out.positions < 0 or not all(fits(p) for p in counts):
            raise SpecstreamError(
                "bad acceptance statistics: a path deeper than gamma, a negative rank or count, "
                "or a path counted more often than its parent"
            )
        return out

    @classmethod
    def read(cls, folder: Path) -> Acceptance | None:
        """The folder's acceptance.json, or None when it has none."""
        path = Path(folder) / ACCEPTANCE_FILE
        if not path.is_file():
            return None
        try:
            return cls.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            raise SpecstreamError(f"unreadable {path}: {exc}") from None

    def merged(self, other: Acceptance) -> Acceptance:
        counts = dict(self.counts)
        for p, n in other.counts.items():
            counts[p] = counts.get(p, 0) + n
        return Acceptance(self.gamma, self.positions + other.positions, counts, self.source)


def ranks_of(history: Sequence[int], probes: Sequence[tuple[int, list[list[int]]]]) -> list:
    """Rank rows from a greedy decode: each probe is (h, top) where top[j] lists stream j's best
    tokens proposed when the context held h tokens, so stream j's target is history[h + j].
    Probes whose targets are not all known yet are skipped."""
    rows = []
    for h, top in probes:
        if h + len(top) > len(history):
            continue
        row = []
        for j, best in enumerate(top):
            target = history[h + j]
            row.append(best.index(target) if target in best else PROBE_TOP_K)
        rows.append(row)
    return rows


@dataclass(frozen=True)
class TreePlan:
    """A chosen static tree and why: its rank paths (parents first), expected tokens per pass,
    predicted pass cost and speed over plain decoding on this device."""

    paths: tuple[Path_, ...]
    expected_tokens: float
    pass_ms: float
    plain_ms: float
    candidates: list = field(default_factory=list, compare=False)  # (nodes, depth, speedup)

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
        }


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
    return TreePlan(best.paths, best.expected_tokens, best.pass_ms, plain_ms, candidates)


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
