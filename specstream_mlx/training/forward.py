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


def _msa_hidden(arch: Arch, params: StreamParams, h_low: mx.array) -> mx.array:
    """(1, T, d) hidden at the pruning point -> (T, gamma, d) stream hidden after the MSA layers."""
    cfg = params.config
    t, gamma = h_low.shape[1], cfg.gamma
    n_low = len(arch.layers) - cfg.n_msa_layers
    streams = h_low[0, :, None, :] + params.stream_embeddings[None]  # (T, gamma, d)
    x = mx.concatenate([h_low, streams.reshape(1, t * gamma, -1)], axis=1)  # (1, T(1+g), d)
    chain = np.tril(np.ones((t, t), bool))  # a sequence: every earlier token is an ancestor
    mask = _msa_mask(chain, 0, gamma, cfg.mode == "shared")
    positions = mx.concatenate([mx.arange(t), mx.repeat(mx.arange(t), gamma)])
    with arch.positions(positions):
        for i, layer in enumerate(arch.layers[n_low:]):
            x = x + layer.self_attn(layer.input_layernorm(x), mask, None)
            n = layer.post_attention_layernorm(x)
            out = x + layer.mlp(n)
            out = mx.concatenate([out[:, :t], out[:, t:] + params.adapters[i](n[:, t:])], 1)
            x = out
    return x[0, t:].reshape(t, gamma, -1)


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
    hidden = _msa_hidden(arch, params, h_low)  # (T, gamma, d)
    stream_nll, correct, counts = [], [], []
    total = mx.array(0.0)
    for j in range(1, cfg.gamma + 1):
        # stream j at position p predicts token p + 1 + j
        rows = np.nonzero(np.array(loss_mask[1 + j :]))[0]
        counts.append(len(rows))
        if len(rows) == 0:
            stream_nll.append(mx.array(0.0))
            correct.append(mx.zeros((0,), mx.bool_))
            continue
        rows_mx = mx.array(rows)
        logits = arch.lm_head(arch.norm(hidden[rows_mx, j - 1]))  # (n_j, V)
        targets = ids[rows_mx + 1 + j]
        nll = nn.losses.cross_entropy(logits, targets, reduction="mean")
        stream_nll.append(nll)
        correct.append(mx.argmax(logits, axis=-1) == targets)
        total = total + nll
    rows = mx.array(np.nonzero(np.array(loss_mask[1:]))[0])
    if rows.size:
        h = h_low[0, rows]
        prune_logits = arch.lm_head(arch.norm(h + params.prune(h)))
        prune_nll = nn.losses.cross_entropy(prune_logits, ids[rows + 1], reduction="mean")
    else:
        prune_nll = mx.array(0.0)
    return StreamBatchLoss(total + prune_nll, stream_nll, prune_nll, correct, counts)
