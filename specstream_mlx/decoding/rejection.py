"""Sampling that stays lossless: multi-candidate recursive rejection sampling over a draft tree
(SpecInfer, Miao et al. 2023; sampling without replacement as in Recursive Speculative Decoding,
Jeon et al. 2024; paper Appendix F). mlx-free: numpy on the distributions, shared by the MLX and
the PyTorch decoders.

At a node whose target distribution (the main stream's, after temperature / top-k / top-p) is p,
the children are candidates x_1, x_2, ... drawn in that order *without replacement* from a draft
distribution q (the streams' distribution for that depth, processed the same way), or fixed
tokens (prompt lookup: q is a point mass). Candidate i is accepted with probability
min(1, p_i(x_i) / q_i(x_i)), where q_i is q renormalised without x_1..x_{i-1}; when it is rejected,
p_{i+1} = normalise(max(p_i - q_i, 0)). If every child is rejected the token is drawn from the last
residual; an accepted child's own children are tried next, with that child's target. Each stage is
standard speculative sampling (target p_i, draft q_i), whose output is distributed as p_i whatever
q_i is, so the tokens are distributed exactly as plain sampling's, for any streams.

That guarantee needs the tree's shape to be fixed before the candidates are drawn: a draft is cut
to its first N nodes in breadth-first order (every parent keeps a prefix of its candidates), never
by the pruning head, whose choices would depend on the drawn tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .tree import Tree

# Residual mass below this is treated as none left (p_i == q_i up to rounding: the candidate was
# accepted with probability 1, so the residual is never sampled in exact arithmetic).
_EMPTY = 1e-12


def rng_for(seed: int | None) -> np.random.Generator:
    """The decoder's random source: a fixed seed replays the same tokens."""
    return np.random.default_rng(seed)


def draw_candidates(q: np.ndarray, k: int, rng: np.random.Generator) -> list[int]:
    """Up to k distinct tokens drawn from q without replacement, in drawing order (Gumbel-top-k:
    the order of log q + Gumbel noise is that of sequential draws without replacement)."""
    support = np.flatnonzero(q > 0)
    k = min(k, len(support))
    if k == 0:
        return []
    keys = np.log(q[support]) - np.log(-np.log(rng.random(len(support))))
    top = np.argpartition(-keys, k - 1)[:k]
    return support[top[np.argsort(-keys[top])]].tolist()


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    """One token from the distribution p (inverse CDF)."""
    cdf = np.cumsum(p, dtype=np.float64)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(p) - 1))


def verify_sampled(
    tree: Tree,
    target: Callable[[int], np.ndarray],
    drafts: list[np.ndarray | None],
    rng: np.random.Generator,
) -> tuple[list[int], int]:
    """Walk `tree` from the root by recursive rejection sampling. `target(node)` is the main
    stream's distribution at a node (V,); `drafts[d]` the distribution the candidates at depth
    d + 1 were drawn from (None: fixed tokens). Returns the accepted nodes (root first) and the
    token drawn after the last one."""
    children: dict[int, list[int]] = {}
    for node in range(1, len(tree)):
        children.setdefault(tree.parents[node], []).append(node)
    node, path = 0, [0]
    while True:
        p = np.asarray(target(node), dtype=np.float64)
        p = p / p.sum()
        kids = children.get(node, [])
        q = drafts[tree.depths[node]] if kids else None
        q = None if q is None else np.asarray(q, dtype=np.float64)
        accepted = None
        for child in kids:
            x = tree.tokens[child]
            if q is None:  # a fixed token: q_i is a point mass at x
                if rng.random() < p[x]:
                    accepted = child
                    break
                p[x] = 0.0
            else:
                q = q / q.sum()
                if rng.random() * q[x] < p[x]:  # u < p(x) / q(x)
                    accepted = child
                    break
                p = np.maximum(p - q, 0.0)
                q[x] = 0.0  # the next candidate was drawn without this one
            total = p.sum()
            if total <= _EMPTY:
                break  # unreachable in exact arithmetic (see _EMPTY)
            p = p / total
        if accepted is None:
            if p.sum() <= _EMPTY:
                p = np.asarray(target(node), dtype=np.float64)
            return path, sample(p, rng)
        node = accepted
        path.append(node)


def cap_breadth_first(tree: Tree, max_nodes: int) -> Tree:
    """The first `max_nodes` nodes of a draft in breadth-first order (draft_tree's order): a
    shape fixed before any candidate is drawn, so the cut keeps sampling exact."""
    if len(tree) <= max_nodes:
        return tree
    n = max(max_nodes, 1)
    return Tree(tree.tokens[:n], tree.parents[:n], tree.depths[:n])
