"""What a decoder drafts each pass: the tree policy, apart from StreamConfig, which says what the
streams' weights are. It is the streams' own tree or the static tree calibrated for the device;
the calibrated one is planned once per active model or adapter and device, on the first
speculative generation there, and kept on the session (calibration.tuned), not per generation."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from .tree import Tree, draft_depth

RankPath = tuple[int, ...]


@dataclass(frozen=True)
class TreePolicy:
    top_k: int = 1  # tokens taken from each stream's logits
    max_nodes: int = 1  # node cap after pruning, root included (a lookup chain is not cut)
    prune_threshold: float = 0.0  # early-exit transition probability below which a child goes
    depth: int = 0  # streams the draft is taken from (0: nothing drafted from the streams)
    paths: tuple[RankPath, ...] | None = None  # a static sparse tree; None: every stream's top_k

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

    def fixed_paths(self) -> tuple[RankPath, ...] | None:
        """The tree as rank paths when its shape never changes (nothing can be pruned): every
        pass then has the same shape, so acceptance and the next draft can stay on the device.
        None when pruning may cut it."""
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
