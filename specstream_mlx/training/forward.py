"""The training forward pass and the loss of eq. 6 for one sequence (lossless mode).

Every position t that has a target carries gamma streams in the MSA layers; stream j of t attends
to the main stream of positions <= t and to streams 1..j of t (the same mask as decoding, with the
sequence as a chain of ancestors), and predicts token t + 1 + j.

In lossless mode the base is frozen and the main stream never attends to streams, so everything
the main stream computes is a constant of the sequence: the hidden state at the pruning point and
the main keys/values of every MSA layer. `base_features` computes them once (the trainer caches
them across epochs); each training step then runs only the stream rows, which attend to those
keys/values through `FrozenMainCache`. This is exact: the loss equals the full forward's.

Targets: a position's token in the text, or (self targets) the frozen base's greedy prediction
for it from the true prefix, which the same forward yields. Decoding accepts a draft when it
equals the base's greedy choice, so self targets teach the streams what will be accepted, on any
text, without generating the base's own answers first. Soft targets add the base's whole
distribution for that token (its SOFT_TOP_K most likely tokens, renormalised; kept per position
from the same forward): stream j at position t learns the mean of the cross-entropy to the
base's greedy token and the cross-entropy to the base's distribution for token t + 1 + j (the
latter is the KL divergence up to a constant), as in knowledge distillation.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import KVCache

from ..decoding.tree_step import MsaRows, _msa_mask, msa_block, msa_layers, stream_inputs
from ..models.arch import Arch
from ..streams.params import StreamParams
from .positions import shared_stream_positions, stream_positions

TARGETS = ("text", "self", "soft")
SOFT_TOP_K = 32  # tokens of the base's distribution kept per position for soft targets


@dataclass
class BaseFeatures:
    """What the frozen base computes for one sequence, independent of the streams."""

    ids: mx.array  # (T,) token ids
    loss_mask: np.ndarray  # (T,) bool: token i is a completion token (a valid target)
    targets: mx.array  # (T,) what position i is scored against: ids[i], or the base's greedy
    # prediction for position i from ids[:i] (self targets; targets[0] = ids[0])
    h_low: mx.array  # (T, d) hidden state at the pruning point (input of the MSA layers)
    main_kv: list[tuple[mx.array, mx.array]]  # per MSA layer: (1, H_kv, T, D) rotated keys, values
    soft: Soft | None = None  # soft targets: the base's distribution for each position's token

    @property
    def nbytes(self) -> int:
        soft = 0 if self.soft is None else self.soft.ids.nbytes + self.soft.probs.nbytes
        return self.h_low.nbytes + sum(k.nbytes + v.nbytes for k, v in self.main_kv) + soft


@dataclass
class Soft:
    """The frozen base's distribution for each position's token, from the true prefix: its
    SOFT_TOP_K most likely tokens and their probabilities renormalised over them (row 0, which
    nothing predicts, is the first token with probability 1)."""

    ids: mx.array  # (T, K) uint32
    probs: mx.array  # (T, K) float32, rows sum to 1

    @staticmethod
    def of(logits: mx.array, first: mx.array) -> Soft:
        """`logits` (T, V): row i predicts token i + 1."""
        k = min(SOFT_TOP_K, logits.shape[-1])
        ids = mx.argpartition(-logits, k - 1, axis=-1)[:, :k]
        probs = mx.softmax(mx.take_along_axis(logits, ids, axis=-1).astype(mx.float32), axis=-1)
        ids = mx.concatenate([mx.broadcast_to(first.reshape(1, 1), (1, k)), ids[:-1]])
        one = mx.concatenate([mx.ones((1, 1)), mx.zeros((1, k - 1))], axis=1)
        return Soft(ids.astype(mx.uint32), mx.concatenate([one, probs[:-1]]))

    def cross_entropy(self, logits: mx.array, rows: mx.array) -> mx.array:
        """(R, V) logits scored against the base's distribution of token rows `rows`: (R,)."""
        logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        return -(self.probs[rows] * mx.take_along_axis(logp, self.ids[rows], axis=-1)).sum(-1)


@dataclass
class StreamBatchLoss:
    """Loss terms of one sequence: means over the positions that have a target."""

    total: mx.array  # scalar: sum_j alpha_j * stream_nll[j] + prune_nll (+ alpha_0 * main)
    stream_nll: list[mx.array]  # per stream j = 1..gamma
    prune_nll: mx.array
    stream_correct: list[mx.array]  # (n_j,) bool per stream: greedy prediction == target
    counts: list[int]  # n_j per stream
    main_nll: mx.array | None = None  # shared mode: the next-token NLL of the main stream


class FrozenMainCache:
    """An MSA layer's keys/values for stream rows: the sequence's main-stream keys/values
    (constants) followed by the stream rows of this pass."""

    offset = 0  # unused: stream rows are rotated to explicit positions

    def __init__(self, keys: mx.array, values: mx.array):
        self.keys, self.values = keys, values

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        return (
            mx.concatenate([self.keys, keys], axis=2),
            mx.concatenate([self.values, values], axis=2),
        )


def blocks(arch: Arch, h: mx.array, start: int, stop: int) -> mx.array:
    """(1, T, d) hidden state entering block `start` -> leaving block stop - 1 (causal)."""
    for layer in arch.layers[start:stop]:
        h = layer(h, "causal", None)
    return h


def lower_hidden(arch: Arch, n_low: int, ids: mx.array) -> mx.array:
    """(T,) token ids -> (1, T, d) hidden state after the layers below the MSA layers."""
    return blocks(arch, arch.embed(ids[None]), 0, n_low)


@dataclass
class Frozen:
    """A sequence's hidden state after its first `blocks` blocks, whose weights do not train
    (shared and next-token training with LoRA in the top blocks only): computed once per
    sequence and cached by the trainer, as lossless mode caches its base features."""

    blocks: int  # 0: the token embeddings
    h: mx.array  # (1, T, d)

    @property
    def nbytes(self) -> int:
        return self.h.nbytes

    @classmethod
    def of(cls, arch: Arch, ids, n_blocks: int) -> Frozen:
        h = blocks(arch, arch.embed(mx.array(ids)[None]), 0, n_blocks)
        if n_blocks:
            mx.eval(h)
        return cls(n_blocks, h)


def base_features(
    arch: Arch, n_msa_layers: int, ids, loss_mask, targets: str = "text"
) -> BaseFeatures:
    """Run the frozen base over one sequence once: the hidden state at the pruning point, the
    main keys/values of each MSA layer (a KV cache records them) and the targets (`TARGETS`)."""
    ids = mx.array(ids)
    n_low = len(arch.layers) - n_msa_layers
    h = lower_hidden(arch, n_low, ids)  # (1, T, d)
    h_low, caches = h[0], [KVCache() for _ in range(n_msa_layers)]
    for layer, cache in zip(arch.layers[n_low:], caches, strict=True):
        h = layer(h, "causal", cache)
    main_kv = [(c.keys[..., : c.offset, :], c.values[..., : c.offset, :]) for c in caches]
    if targets not in TARGETS:
        raise ValueError(f"targets must be one of {TARGETS}, got {targets!r}")
    own, soft = ids, None
    if targets != "text":
        logits = arch.lm_head(arch.norm(h[0]))  # row i predicts token i + 1
        greedy = mx.argmax(logits, axis=-1).astype(ids.dtype)
        own = mx.concatenate([ids[:1], greedy[:-1]])
        if targets == "soft":
            soft = Soft.of(logits, ids[:1])
    mx.eval(h_low, main_kv, own, [] if soft is None else [soft.ids, soft.probs])
    return BaseFeatures(ids, np.asarray(loss_mask, bool), own, h_low, main_kv, soft)


def stream_hidden(arch: Arch, params: StreamParams, feats: BaseFeatures, positions: np.ndarray):
    """(P, gamma, d) last hidden states of the streams of `positions` after the MSA layers: the
    stream rows alone, attending to the sequence's cached main keys/values."""
    cfg = params.config
    t, gamma, s = feats.h_low.shape[0], cfg.gamma, len(positions)
    if s == 0:
        return mx.zeros((0, gamma, feats.h_low.shape[-1]), feats.h_low.dtype)
    rows = mx.array(positions)
    x = stream_inputs(arch, params, feats.h_low[rows], gamma)  # (1, P * gamma, d)
    chain = np.tril(np.ones((t, t), bool))  # a sequence: every earlier token is an ancestor
    mask = _msa_mask(chain, 0, gamma, cfg.main_needs_streams, positions)[t:]  # stream rows
    main_kv = [FrozenMainCache(*kv) for kv in feats.main_kv]
    with arch.positions(mx.repeat(rows, gamma)):
        x = msa_block(arch, params, x, 0, mask, main_kv)
    return x[0].reshape(s, gamma, -1)


@dataclass
class StreamStates:
    """A sequence's streams after the MSA layers, at every stream position: a constant of the
    sequence once the streams are trained and frozen, so parent-head training (their only
    trainable part then) computes them once and caches them."""

    targets: mx.array  # (T,) as BaseFeatures.targets
    loss_mask: np.ndarray  # (T,) bool
    positions: np.ndarray  # (P,) stream positions (positions.stream_positions)
    hidden: mx.array  # (P, gamma, d)

    @property
    def nbytes(self) -> int:
        return self.hidden.nbytes + self.targets.nbytes

    @classmethod
    def of(cls, arch: Arch, params: StreamParams, feats: BaseFeatures) -> StreamStates:
        positions = stream_positions(feats.loss_mask, params.config.gamma)
        hidden = stream_hidden(arch, params, feats, positions)
        mx.eval(hidden)
        return cls(feats.targets, feats.loss_mask, positions, hidden)

    @classmethod
    def shared(cls, arch: Arch, params: StreamParams, ids, loss_mask) -> StreamStates:
        """Shared mode's: the model with its (frozen) LoRA layers over the sequence, its
        streams where shared training scores them (`shared_loss`)."""
        ids, mask = mx.array(ids), np.asarray(loss_mask, bool)
        carry = shared_stream_positions(params.config, mask)
        positions = np.intersect1d(stream_positions(mask, params.config.gamma), carry)
        streams = shared_hidden(arch, params, Frozen.of(arch, ids, 0), carry)[2]
        hidden = streams[mx.array(np.searchsorted(carry, positions))]
        mx.eval(hidden)
        return cls(ids, mask, positions, hidden)


def parent_loss(arch: Arch, params: StreamParams, states: StreamStates, positions: np.ndarray):
    """Parent-head training's loss for one sequence: the streams' mean NLLs at `positions` (some
    of states.positions), their frozen states read through the parent heads, each with its
    target's true parent token. Returns (their sum, the NLL per stream)."""
    index = mx.array(np.searchsorted(states.positions, positions))
    hidden = states.hidden[index]
    nll, _, _ = _stream_terms(arch, params, hidden, positions, states.targets, states.loss_mask)
    return sum(nll, mx.array(0.0)), nll


def stream_loss(
    arch: Arch, params: StreamParams, feats: BaseFeatures, positions: np.ndarray | None = None
) -> StreamBatchLoss:
    """Lossless-mode loss for one sequence: alpha_0 = 0, alpha_j = 1, plus the pruning head's
    next-token NLL. `positions` (default: every position with a stream target) carry streams;
    the pruning head learns on the targets those positions' streams cover."""
    cfg = params.config
    targets, mask_np = feats.targets, feats.loss_mask
    if positions is None:
        positions = stream_positions(mask_np, cfg.gamma)
    hidden = stream_hidden(arch, params, feats, positions)  # (P, gamma, d)
    stream_nll, correct, counts = _stream_terms(
        arch, params, hidden, positions, (targets, feats.soft), mask_np
    )
    total = sum(stream_nll, mx.array(0.0))
    # the pruning head learns next-token prediction on the rows these positions' streams span
    covered = np.zeros(len(mask_np) - 1, bool)  # row r predicts token r + 1
    if len(positions):
        covered[positions[0] : positions[-1] + cfg.gamma + 1] = True
    rows = np.nonzero(mask_np[1:] & covered)[0]
    prune_nll = _prune_nll(arch, params, feats.h_low, targets, rows)
    return StreamBatchLoss(total + prune_nll, stream_nll, prune_nll, correct, counts)


def _stream_terms(
    arch: Arch, params: StreamParams, hidden: mx.array, positions: np.ndarray, targets, mask_np
):
    """Mean NLL and hits of each stream j over the (position, j) pairs that have a target.
    `targets`: (T,) token ids, or (ids, Soft or None): with soft targets the NLL is the mean of
    the hard and the soft cross-entropy. Parent heads read each target's true parent token."""
    ids, soft = targets if isinstance(targets, tuple) else (targets, None)
    gamma = params.config.gamma
    # Every (position, stream) pair with a target: stream j at position p predicts p + 1 + j.
    pairs = [
        (i, j)
        for j in range(1, gamma + 1)
        for i, p in enumerate(positions)
        if p + 1 + j < len(mask_np) and mask_np[p + 1 + j]
    ]
    counts = [sum(1 for _, j in pairs if j == k) for k in range(1, gamma + 1)]
    stream_nll, correct = [], []
    if pairs:
        idx, js = mx.array([i for i, _ in pairs]), mx.array([j for _, j in pairs])
        rows = mx.array(positions)[idx] + 1 + js
        h = hidden[idx, js - 1]  # (R, d)
        if params.config.parent_rank:
            h = _parents_read(arch, params, h, ids[rows - 1], counts)
        # one LM-head pass for all streams: the head's weights are read once
        logits = arch.lm_head(arch.norm(h))  # (R, V)
        nll = nn.losses.cross_entropy(logits, ids[rows])  # (R,)
        if soft is not None:
            nll = 0.5 * (nll + soft.cross_entropy(logits, rows))
        hits = mx.argmax(logits, axis=-1) == ids[rows]
    start = 0
    for n in counts:  # pairs are grouped by stream, in stream order
        if n == 0:
            stream_nll.append(mx.array(0.0))
            correct.append(mx.zeros((0,), mx.bool_))
            continue
        stream_nll.append(nll[start : start + n].mean())
        correct.append(hits[start : start + n])
        start += n
    return stream_nll, correct, counts


def _parents_read(arch: Arch, params: StreamParams, h: mx.array, parents: mx.array, counts):
    """(R, d) stream states grouped by stream (`counts` rows each, in stream order), each
    through its stream's parent head with its true parent token (R,)."""
    out, start = [], 0
    for head, n in zip(params.parent_heads, counts, strict=True):
        out.append(head(h[start : start + n], arch.embed(parents[start : start + n])))
        start += n
    return mx.concatenate(out)


def _prune_nll(arch: Arch, params: StreamParams, h_low: mx.array, ids, rows: np.ndarray):
    """The pruning head's next-token NLL on hidden rows `rows` (row r predicts token r + 1)."""
    if not len(rows):
        return mx.array(0.0)
    h = h_low[mx.array(rows)]
    logits = arch.lm_head(arch.norm(h + params.prune(h)))
    return nn.losses.cross_entropy(logits, ids[mx.array(rows) + 1], reduction="mean")


def shared_hidden(arch: Arch, params: StreamParams, frozen: Frozen, carry: np.ndarray):
    """Shared mode, the model with its LoRA layers over one sequence, from its `frozen` hidden
    state on; the positions in `carry` have streams, and in the MSA layers their main stream
    attends to them. Returns the hidden state at the pruning point (T, d), the main stream's
    last hidden (T, d) and the streams' (len(carry), gamma, d)."""
    cfg = params.config
    t = frozen.h.shape[1]
    h = blocks(arch, frozen.h, frozen.blocks, len(arch.layers) - cfg.n_msa_layers)  # (1, T, d)
    chain = np.tril(np.ones((t, t), bool))
    rows = MsaRows.of(mx.arange(t), chain, 0, cfg.gamma, cfg.main_needs_streams, carry)
    x = msa_layers(arch, params, h, rows, None)
    return h[0], x[0, :t], x[0, t:].reshape(len(carry), cfg.gamma, -1)


def shared_loss(
    arch: Arch, params: StreamParams, ids, loss_mask, frozen: Frozen | None = None
) -> StreamBatchLoss:
    """Shared-mode loss of eq. 6: alpha_0 = 1 on the main stream's next-token NLL, alpha_j = 0.1
    on the streams', plus the pruning head's next-token NLL (which trains the projection only).
    `frozen`: the sequence's cached hidden state below the blocks that train (default: none)."""
    alpha_main, alpha_stream = 1.0, 0.1
    cfg = params.config
    ids, mask_np = mx.array(ids), np.asarray(loss_mask, bool)
    carry = shared_stream_positions(cfg, mask_np)
    h_low, main, streams = shared_hidden(arch, params, frozen or Frozen.of(arch, ids, 0), carry)
    rows = np.nonzero(mask_np[1:])[0]  # row r predicts token r + 1
    logits = arch.lm_head(arch.norm(main[mx.array(rows)]))
    main_nll = nn.losses.cross_entropy(logits, ids[mx.array(rows) + 1], reduction="mean")
    positions = np.intersect1d(stream_positions(mask_np, cfg.gamma), carry)
    index = mx.array(np.searchsorted(carry, positions))
    stream_nll, correct, counts = _stream_terms(
        arch, params, streams[index], positions, ids, mask_np
    )
    prune_nll = _prune_nll(arch, params, mx.stop_gradient(h_low), ids, rows)
    total = alpha_main * main_nll + alpha_stream * sum(stream_nll, mx.array(0.0)) + prune_nll
    return StreamBatchLoss(total, stream_nll, prune_nll, correct, counts, main_nll)


def next_token_loss(model, ids, loss_mask, frozen=None) -> tuple[mx.array, mx.array]:
    """The paper's "Baseline": plain next-token fine-tuning. Mean NLL of the completion tokens
    under `model` (with its LoRA layers) and the greedy hits, (n,) bool. `frozen`: (Arch,
    Frozen), the sequence's cached hidden state below the blocks that train."""
    ids, rows = mx.array(ids), np.nonzero(np.asarray(loss_mask, bool)[1:])[0]
    if not len(rows):
        return mx.array(0.0), mx.zeros((0,), mx.bool_)
    if frozen is None:
        logits = model(ids[None])[0, mx.array(rows)]  # row r predicts token r + 1
    else:
        arch, f = frozen
        h = blocks(arch, f.h, f.blocks, len(arch.layers))[0, mx.array(rows)]
        logits = arch.lm_head(arch.norm(h))
    targets = ids[mx.array(rows) + 1]
    nll = nn.losses.cross_entropy(logits, targets, reduction="mean")
    return nll, mx.argmax(logits, axis=-1) == targets
