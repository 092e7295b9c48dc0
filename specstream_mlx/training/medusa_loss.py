"""Medusa-1 training terms (the comparator of `specstream bench`): the frozen base's last hidden
states, which the heads read, and the heads' loss."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from ..baselines.medusa import HEAD_DECAY, MedusaHeads
from ..models.arch import Arch
from .data import Example


def final_hidden(arch: Arch, ids: mx.array) -> mx.array:
    """(T,) token ids -> (T, d) the frozen base's normed last hidden states (heads' input)."""
    h = arch.embed(ids[None])
    for layer in arch.layers:
        h = layer(h, "causal", None)
    return arch.norm(h)[0]


def head_targets(ex: Example, n_heads: int) -> list[tuple[int, int, int]]:
    """(position, head k, target id): head k at position p predicts token p + 1 + k."""
    t = len(ex.ids)
    return [
        (p, k, ex.ids[p + 1 + k])
        for k in range(1, n_heads + 1)
        for p in range(t - 1 - k)
        if ex.loss_mask[p + 1 + k]
    ]


def medusa_loss(heads: MedusaHeads, hidden: mx.array, ex: Example, positions) -> tuple:
    """Medusa-1 loss over `positions`: sum_k 0.8^(k-1) * mean NLL of head k; and per-head NLL."""
    keep = set(int(p) for p in positions)
    nlls, total = [], mx.array(0.0)
    for k in range(1, heads.config.n_heads + 1):
        pairs = [(p, y) for p, kk, y in head_targets(ex, heads.config.n_heads) if kk == k]
        pairs = [(p, y) for p, y in pairs if p in keep]
        if not pairs:
            nlls.append(mx.array(0.0))
            continue
        rows, targets = mx.array([p for p, _ in pairs]), mx.array([y for _, y in pairs])
        block, head = heads.blocks[k - 1], heads.heads[k - 1]
        nll = nn.losses.cross_entropy(head(block(hidden[rows])), targets, reduction="mean")
        nlls.append(nll)
        total = total + HEAD_DECAY ** (k - 1) * nll
    return total, nlls
