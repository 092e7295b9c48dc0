"""The training forward pass and the loss of eq. 6 for one sequence.

Every position t of a sequence carries gamma streams in the MSA layers; stream j of t attends to
the main stream of positions <= t and to streams 1..j of t (the same mask as decoding, with the
sequence as a chain of ancestors), and predicts token t + 1 + j. The base model is frozen in
lossless mode, so everything below the MSA layers runs without gradients.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..decoding.tree_step import _msa_mask
from ..models.arch import Arch
from ..streams.params import StreamParams


@dataclass
class StreamBatchLoss:
    """Loss terms of one sequence: means over the positions that have a target."""

    total: mx.array  # scalar: sum_j alpha_j * stream_nll[j] + prune_nll (+ alpha_0 * main)
    stream_nll: list[mx.array]  # per stream j = 1..gamma
    prune_nll: mx.array
    stream_correct: list[mx.array]  # (n_j,) bool per stream: greedy prediction == target
    counts: list[int]  # n_j per stream


def stream_positions(loss_mask: np.ndarray, gamma: int) -> np.ndarray:
    """Positions whose streams have at least one target (prompt tokens need no streams)."""
    t = len(loss_mask)
    return np.array([p for p in range(t) if loss_mask[p + 2 : p + 2 + gamma].any()], dtype=int)


def _msa_hidden(
    arch: Arch, params: StreamParams, h_low: mx.array, positions: np.ndarray
) -> mx.array:
    """(1, T, d) hidden at the pruning point -> (P, gamma, d) hidden of the streams of the
    given positions after the MSA layers."""
    cfg = params.config
    t, gamma, s = h_low.shape[1], cfg.gamma, len(positions)
    n_low = len(arch.layers) - cfg.n_msa_layers
    rows = mx.array(positions)
    streams = h_low[0, rows, None, :] + params.stream_embeddings[None]  # (P, gamma, d)
    x = mx.concatenate([h_low, streams.reshape(1, s * gamma, -1)], axis=1)  # (1, T+P*g, d)
    chain = np.tril(np.ones((t, t), bool))  # a sequence: every earlier token is an ancestor
    mask = _msa_mask(chain, 0, gamma, cfg.mode == "shared", positions)
    positions = mx.concatenate([mx.arange(t), mx.repeat(rows, gamma)])
    with arch.positions(positions):
        for i, layer in enumerate(arch.layers[n_low:]):
            x = x + layer.self_attn(layer.input_layernorm(x), mask, None)
            n = layer.post_attention_layernorm(x)
            out = x + layer.mlp(n)
            out = mx.concatenate([out[:, :t], out[:, t:] + params.adapters[i](n[:, t:])], 1)
            x = out
    return x[0, t:].reshape(s, gamma, -1)


def lower_hidden(arch: Arch, n_low: int, ids: mx.array) -> mx.array:
    """(T,) token ids -> (1, T, d) hidden state after the layers below the MSA layers."""
    h = arch.embed(ids[None])
    for layer in arch.layers[:n_low]:
        h = layer(h, "causal", None)
    return h


def stream_loss(
    arch: Arch, params: StreamParams, h_low: mx.array, ids: mx.array, loss_mask: mx.array
) -> StreamBatchLoss:
    """Lossless-mode loss for one sequence: alpha_0 = 0, alpha_j = 1, plus the pruning head's
    next-token NLL. `loss_mask[i]` says token i is a completion token (a valid target)."""
    cfg = params.config
    mask_np = np.array(loss_mask)
    positions = stream_positions(mask_np, cfg.gamma)
    hidden = _msa_hidden(arch, params, h_low, positions)  # (P, gamma, d)
    # Every (position, stream) pair with a target: stream j at position p predicts p + 1 + j.
    pairs = [
        (i, j)
        for j in range(1, cfg.gamma + 1)
        for i, p in enumerate(positions)
        if p + 1 + j < len(mask_np) and mask_np[p + 1 + j]
    ]
    counts = [sum(1 for _, j in pairs if j == k) for k in range(1, cfg.gamma + 1)]
    stream_nll, correct = [], []
    total = mx.array(0.0)
    if pairs:
        idx, js = mx.array([i for i, _ in pairs]), mx.array([j for _, j in pairs])
        # one LM-head pass for all streams: the head's weights are read once
        logits = arch.lm_head(arch.norm(hidden[idx, js - 1]))  # (R, V)
        targets = ids[mx.array(positions)[idx] + 1 + js]
        nll = nn.losses.cross_entropy(logits, targets)  # (R,)
        hits = mx.argmax(logits, axis=-1) == targets
    start = 0
    for n in counts:  # pairs are grouped by stream, in stream order
        if n == 0:
            stream_nll.append(mx.array(0.0))
            correct.append(mx.zeros((0,), mx.bool_))
            continue
        stream_nll.append(nll[start : start + n].mean())
        correct.append(hits[start : start + n])
        total = total + stream_nll[-1]
        start += n
    rows = mx.array(np.nonzero(np.array(loss_mask[1:]))[0])
    if rows.size:
        h = h_low[0, rows]
        prune_logits = arch.lm_head(arch.norm(h + params.prune(h)))
        prune_nll = nn.losses.cross_entropy(prune_logits, ids[rows + 1], reduction="mean")
    else:
        prune_nll = mx.array(0.0)
    return StreamBatchLoss(total + prune_nll, stream_nll, prune_nll, correct, counts)
