"""The parameters speculative streams add to a base model (paper eq. 4, Appendix C)."""

from __future__ import annotations

import copy
from dataclasses import replace

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

from .config import StreamConfig


class LowRank(nn.Module):
    """x -> (x @ a) @ b, a: (d, r), b: (r, d). b starts at zero, so an untrained one adds 0."""

    def __init__(self, dims: int, rank: int):
        super().__init__()
        self.a = mx.random.normal((dims, rank)) * dims**-0.5
        self.b = mx.zeros((rank, dims))

    def __call__(self, x: mx.array) -> mx.array:
        return (x @ self.a) @ self.b


class ParentHead(nn.Module):
    """A stream's last hidden state h and its parent token's embedding e -> h + b(silu(a([h; e])))
    (both inputs RMS-normed first: the embedding is ~20x smaller than the hidden state). b
    starts at zero, so an untrained head leaves the stream as it was."""

    def __init__(self, dims: int, rank: int):
        super().__init__()
        self.a = mx.random.normal((2 * dims, rank)) * (2 * dims) ** -0.5
        self.b = mx.zeros((rank, dims))

    def __call__(self, h: mx.array, e: mx.array) -> mx.array:
        x = mx.concatenate([mx.fast.rms_norm(h, None, 1e-5), mx.fast.rms_norm(e, None, 1e-5)], -1)
        return h + nn.silu(x @ self.a) @ self.b


class StreamParams(nn.Module):
    """Stream identifier embeddings P_j (gamma, d), one stream adapter per MSA layer (applied to
    stream rows of the MLP path only; shared mode only with `shared_stream_adapters`), and the
    pruning projection o(h) = h + low_rank(h) (identity at init) whose output feeds the base
    head (early exit), and with `next_token_guess` the projection (d, d) of the early-exit guess's
    token embedding into the streams' initial state (zero at init), and with `attention_adapters`
    one more low-rank adapter per MSA layer on the stream rows' attention input, and with
    `parent_rank` a ParentHead per stream after the MSA layers. Shared mode's LoRA layers live
    in the model (streams/lora.py)."""

    def __init__(self, config: StreamConfig, dims: int):
        super().__init__()
        self.config = config
        self.acceptance = None  # decoding.plan.Acceptance, read with an adapter folder
        self.draft = None  # decoding.tree_step.DraftVocab: the head over config.draft_vocab
        self.stream_embeddings = mx.random.normal((config.gamma, dims)) * 0.02
        if config.has_stream_adapters:
            self.adapters = [
                LowRank(dims, config.stream_adapter_rank) for _ in range(config.n_msa_layers)
            ]
        if config.attention_adapters:  # plain learning rate: they add to a normed input
            self.attention_adapters = [
                LowRank(dims, config.stream_adapter_rank) for _ in range(config.n_msa_layers)
            ]
        self.prune = LowRank(dims, config.prune_rank)
        if config.next_token_guess:
            # trained at the plain learning rate: its input, a token embedding, sums over all d
            # dimensions, so lr x hidden RMS (the stream embeddings' rate) would move its output
            # tens of times faster than theirs
            self.guess = mx.zeros((dims, dims))
        if config.parent_rank:
            self.parent_heads = [ParentHead(dims, config.parent_rank) for _ in range(config.gamma)]

    def randomize(self, seed: int) -> StreamParams:
        """Random values for every stream parameter: exactness must hold for any streams."""
        flat = tree_flatten(self.parameters())
        keys = mx.random.split(mx.random.key(seed), len(flat))
        new = [
            (name, mx.random.normal(v.shape, key=k) * v.shape[-1] ** -0.5)
            for (name, v), k in zip(flat, keys, strict=True)
        ]
        self.update(tree_unflatten(new))
        return self

    def with_config(self, **changes) -> StreamParams:
        """The same weights (shared, not copied) under a changed decoding config, e.g. another
        tree shape: `params.with_config(top_k=1, max_tree_nodes=4)`."""
        other = copy.copy(self)
        other.config = replace(self.config, **changes)
        if other.config.draft_vocab != self.config.draft_vocab:
            other.draft = None
        return other
