"""What a decoder drafts each pass: the tree policy, apart from StreamConfig, which says what the
streams' weights are. It is the streams' own tree or the static tree calibrated for the device;
the calibrated one is planned once per active model or adapter and device, on the first
speculative generation there, and kept on the session (calibration.tuned), not per generation."""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass

import numpy as np

from .tree import Tree, draft_depth

RankPath = tuple[int, ...]
# Prompt tokens a generation adds to its streams' draft vocabulary (prompt_tokens).
PROMPT_SLOTS = 256


def prompt_tokens(vocab, prompt_ids: list[int]) -> list[int]:
    """The prompt's tokens that a generation's streams draft from besides their adapter's draft
    vocabulary `vocab` (a column name, a value: text an answer copies): those outside it, the
    last PROMPT_SLOTS distinct ones."""
    known, extra = set(vocab), []
    for token in reversed(prompt_ids):
        if len(extra) == PROMPT_SLOTS:
            break
        if token not in known:
            known.add(token)
            extra.append(token)
    return extra


@dataclass(frozen=True)
class TreePolicy:
    top_k: int = 1  # tokens taken from each stream's logits
    max_nodes: int = 1  # node cap after pruning, root included (a lookup chain is not cut)
    prune_threshold: float = 0.0  # early-exit transition probability below which a child goes
    depth: int = 0  # streams the draft is taken from (0: nothing drafted from the streams)
    paths: tuple[RankPath, ...] | None = None  # a static sparse tree; None: every stream's top_k
    # gated: one static tree per bin of stream 1's confidence at the accepted node (the
    # probability of its top token); bins[b] is drafted where gates[b - 1] <= it < gates[b]
    gates: tuple[float, ...] = ()
    bins: tuple[tuple[RankPath, ...], ...] = ()

    @classmethod
    def of(cls, cfg) -> TreePolicy:
        """The streams' own tree (StreamConfig: top_k, node cap, threshold, static tree)."""
        if cfg.tree is not None:
            return cls.static(cfg.tree)
        return cls(cfg.top_k, cfg.max_tree_nodes, cfg.prune_threshold, draft_depth(cfg))

    @classmethod
    def static(cls, paths) -> TreePolicy:
        """A static sparse tree of rank paths (parents first); () drafts nothing."""
        paths = tuple(tuple(p) for p in paths)
        top_k = 1 + max((r for p in paths for r in p), default=0)
        depth = max((len(p) for p in paths), default=0)
        return cls(top_k, len(paths) + 1, 0.0, depth, paths)

    @classmethod
    def gated(cls, gates, bins) -> TreePolicy:
        """A static tree per bin of stream 1's confidence (`gates`: the bins' inner edges,
        ascending, one fewer than the trees); () drafts nothing in its bin."""
        bins = tuple(tuple(tuple(p) for p in paths) for paths in bins)
        gates = tuple(float(g) for g in gates)
        if len(bins) != len(gates) + 1 or list(gates) != sorted(gates):
            raise ValueError(f"{len(bins)} trees for {len(gates)} ascending gates")
        if len(set(bins)) == 1:
            return cls.static(bins[0])
        every = [p for paths in bins for p in paths]
        top_k = 1 + max((r for p in every for r in p), default=0)
        depth = max((len(p) for p in every), default=0)
        nodes = 1 + max(len(paths) for paths in bins)
        return cls(top_k, nodes, 0.0, depth, None, gates, bins)

    def paths_at(self, confidence: float) -> tuple[RankPath, ...] | None:
        """The static tree drafted at this confidence of stream 1 (None: not a static tree)."""
        if not self.bins:
            return self.paths
        return self.bins[bisect.bisect_right(self.gates, confidence)]

    def static_trees(self) -> tuple[tuple[RankPath, ...], ...] | None:
        """Every tree a pass may draft, as rank paths, when none is ever cut (one per
        confidence bin when gated): each pass's shape is then known before it runs, so
        acceptance and the next draft can stay on the device. None when pruning may cut it."""
        if self.bins:
            return self.bins
        paths = self.fixed_paths()
        return None if paths is None else (paths,)

    def may_cut(self) -> bool:
        """Whether the early-exit head may cut the streams' tree in a pass: a threshold, or more
        candidates than the node cap (a top-1 chain is cut to the cap as it is drafted)."""
        return self.prune_threshold > 0 or (self.top_k > 1 and self.static_trees() is None)

    def fixed_paths(self) -> tuple[RankPath, ...] | None:
        """The tree as rank paths when its shape never changes (nothing can be pruned, no
        gating): every pass then has the same shape. None when pruning may cut it."""
        if self.bins:
            return None
        if self.paths is not None:
            return self.paths
        levels = [
            list(itertools.product(range(self.top_k), repeat=j)) for j in range(1, self.depth + 1)
        ]
        paths = tuple(p for level in levels for p in level)
        if self.prune_threshold > 0 or len(paths) + 1 > self.max_nodes:
            return None
        return paths


@dataclass(frozen=True)
class StaticShape:
    """A static tree's arrays, for acceptance on the device: node j > 0 holds
    drafts[gather[j - 1]] of the flattened (depth, top_k) stream draft."""

    tree: Tree  # tokens are placeholders: only the shape is used
    gather: np.ndarray  # (N - 1,) index into the flattened (depth, top_k) draft
    parents: np.ndarray  # (N,) the root is its own parent
    paths: np.ndarray  # (N, D + 1) each node's path, root first, padded with the node itself
    depth: int  # D, the tree's depth

    @classmethod
    def of(cls, paths: tuple[RankPath, ...], top_k: int) -> StaticShape:
        """The tree of `paths` (parents first) over a (depth, top_k) draft; () is the root alone."""
        index: dict[RankPath, int] = {(): 0}
        parents, depths, gather = [-1], [0], []
        for p in paths:
            index[p] = len(parents)
            parents.append(index[p[:-1]])
            depths.append(len(p))
            gather.append((len(p) - 1) * top_k + p[-1])
        tree = Tree([0] * len(parents), parents, depths)
        depth = max(depths)
        rows = np.zeros((len(tree), depth + 1), dtype=np.int32)
        for node in range(len(tree)):
            chain = [node]
            while parents[chain[-1]] >= 0:
                chain.append(parents[chain[-1]])
            chain = chain[::-1]
            rows[node] = chain + [node] * (depth + 1 - len(chain))
        own = np.array([max(p, 0) for p in parents], dtype=np.int32)
        return cls(tree, np.array(gather, dtype=np.int32), own, rows, depth)
