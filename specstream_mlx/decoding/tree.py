"""The draft tree: built from stream top-k tokens, flattened, with its ancestors-only mask,
per-node rotary positions, pruning, and greedy verification (paper Section 2.3, Appendix G.1)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Tree:
    """A flattened draft tree; node 0 is the root (the last decided token, not yet in the cache)."""

    tokens: list[int]
    parents: list[int]  # parent node index, -1 for the root
    depths: list[int]

    def __len__(self) -> int:
        return len(self.tokens)

    def is_chain(self) -> bool:
        """One node per depth, in order: the tree is a plain run of consecutive tokens."""
        return self.depths == list(range(len(self)))

    def ancestors(self) -> np.ndarray:
        """(N, N) bool: [i, j] is True when node j is node i or one of its ancestors (a node
        with parent -1 is a root: node 0, or the start of another chain packed after it)."""
        n = len(self)
        anc = np.eye(n, dtype=bool)
        for i in range(1, n):  # parents come before children in the flattened order
            if self.parents[i] >= 0:
                anc[i] |= anc[self.parents[i]]
        return anc


def subtree(tree: Tree, keep: list[int]) -> Tree:
    """The nodes `keep` (sorted, root included, every kept node's parent kept) as a tree."""
    index = {node: i for i, node in enumerate(keep)}
    parents = [-1] + [index[tree.parents[n]] for n in keep[1:]]
    return Tree([tree.tokens[n] for n in keep], parents, [tree.depths[n] for n in keep])


def draft_tree(root: int, stream_tokens: list[list[int]]) -> Tree:
    """Root, then stream_tokens[0] as its children, and every token of stream j+1 as a child of
    every node of stream j: 1 + k + k^2 + ... nodes."""
    tokens, parents, depths = [root], [-1], [0]
    level = [0]
    for depth, candidates in enumerate(stream_tokens, start=1):
        next_level = []
        for parent in level:
            for token in candidates:
                next_level.append(len(tokens))
                tokens.append(token)
                parents.append(parent)
                depths.append(depth)
        level = next_level
    return Tree(tokens, parents, depths)


def draft_depth(cfg) -> int:
    """Streams whose tokens can survive pruning. A chain (k=1, no threshold) pruned to N nodes
    keeps exactly its first N-1 levels, so only those are drafted: the same survivors, without
    the early-exit head or the lower layers' work on nodes that would be cut. A static tree
    (`cfg.tree`) drafts as deep as its deepest path."""
    if getattr(cfg, "tree", None) is not None:
        return max((len(p) for p in cfg.tree), default=0)
    if cfg.top_k == 1 and cfg.prune_threshold == 0:
        return max(min(cfg.gamma, cfg.max_tree_nodes - 1), 0)
    return cfg.gamma


def prune(tree: Tree, transition: np.ndarray, threshold: float, max_nodes: int) -> list[int]:
    """Nodes kept: the root, then children whose parent->child probability `transition[i]` is at
    least `threshold`, most probable paths first, at most `max_nodes`, never a child without its
    parent. Returns node indices in increasing (parents-first) order."""
    path = np.ones(len(tree))
    for i in range(1, len(tree)):
        path[i] = path[tree.parents[i]] * transition[i]
    kept = {0}
    # Path probabilities never grow with depth, so this order visits parents before children.
    for i in sorted(range(1, len(tree)), key=lambda i: (-path[i], tree.depths[i], i)):
        if len(kept) >= max_nodes:
            break
        if transition[i] >= threshold and tree.parents[i] in kept:
            kept.add(i)
    return sorted(kept)


def msa_mask(
    anc: np.ndarray, prefix: int, gamma: int, shared: bool, stream_nodes: np.ndarray | None = None
) -> np.ndarray:
    """Rows: M main, then S*gamma streams of the S nodes in `stream_nodes` (default: all; the
    s-th one's stream j at M + s*gamma + j). Columns: prefix | M main | S*gamma streams.
    Stream j of node m sees the prefix, m and its ancestors, and streams 1..j of m; the main
    stream sees only main rows (lossless), or also its own node's streams (shared mode)."""
    m = anc.shape[0]
    nodes = np.arange(m) if stream_nodes is None else np.asarray(stream_nodes)
    s = len(nodes)
    main = np.concatenate([np.ones((m, prefix), bool), anc, np.zeros((m, s * gamma), bool)], 1)
    if shared:
        owner = np.repeat(nodes, gamma)  # (S*gamma,) node of each stream column
        main[:, prefix + m :] = np.arange(m)[:, None] == owner[None, :]
    stream_ctx = np.repeat(anc[nodes], gamma, axis=0)  # (S*gamma, M)
    causal = np.tril(np.ones((gamma, gamma), bool))
    stream_self = np.kron(np.eye(s, dtype=bool), causal)  # (S*gamma, S*gamma)
    streams = np.concatenate([np.ones((s * gamma, prefix), bool), stream_ctx, stream_self], 1)
    return np.concatenate([main, streams], axis=0)


def accept_greedy(tree: Tree, survivors: list[int], argmax: list[int]) -> list[int]:
    """The longest root path whose every child token equals its parent's greedy choice.

    `argmax[m]` is the main stream's greedy token at survivor m. Returns survivor positions
    (indices into `survivors`) of the accepted path, root first.
    """
    local = {node: m for m, node in enumerate(survivors)}
    children: dict[int, list[int]] = {}
    for node in survivors[1:]:
        children.setdefault(tree.parents[node], []).append(node)
    path = [0]
    while True:
        node = survivors[path[-1]]
        want = argmax[path[-1]]
        nxt = next((c for c in children.get(node, []) if tree.tokens[c] == want), None)
        if nxt is None:
            return path
        path.append(local[nxt])
