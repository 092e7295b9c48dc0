"""Medusa-1 heads (Cai et al., 2024), the paper's main comparator: on a frozen base, head k
(k = 1..K) predicts the token k after the next from the base's last hidden state, through a
residual block and its own LM head (initialised from the base head). Drafts are verified by the
same tree step as every other drafter, so greedy output equals plain decoding.

Each head carries a full vocabulary projection (SmolLM2: 49152 x 576 = 28M parameters), which is
what Speculative Streaming avoids. Folders: `medusa.safetensors` + `medusa_config.json`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from ..decoding.passes import top_k_ids
from ..decoding.tree import Tree, draft_tree, prune, subtree
from ..errors import SpecstreamError
from ..models.arch import Arch
from ..streams.adapter_io import base_fingerprint, write_folder

WEIGHTS, CONFIG = "medusa.safetensors", "medusa_config.json"
HEAD_DECAY = 0.8  # Medusa-1's loss weight of head k: 0.8^(k-1)


@dataclass(frozen=True)
class MedusaConfig:
    n_heads: int = 4
    top_k: int = 1  # tokens per head in the draft tree
    max_tree_nodes: int = 5  # root included; a k=1 chain of 4 heads has 5

    def validate(self) -> MedusaConfig:
        problems = []
        if not 1 <= self.n_heads <= 16:
            problems.append(f"n_heads must be in [1, 16], got {self.n_heads}")
        if not 1 <= self.top_k <= 16:
            problems.append(f"top_k must be in [1, 16], got {self.top_k}")
        if self.max_tree_nodes < 1:
            problems.append(f"max_tree_nodes must be >= 1, got {self.max_tree_nodes}")
        if problems:
            raise SpecstreamError("bad medusa config: " + "; ".join(problems))
        return self

    @classmethod
    def from_dict(cls, data: dict) -> MedusaConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


class ResBlock(nn.Module):
    """x + SiLU(W x + b), W and b zero at init: the head starts as the base head."""

    def __init__(self, dims: int):
        super().__init__()
        self.linear = nn.Linear(dims, dims)
        self.linear.weight = mx.zeros((dims, dims))
        self.linear.bias = mx.zeros((dims,))

    def __call__(self, x: mx.array) -> mx.array:
        return x + nn.silu(self.linear(x))


class MedusaHeads(nn.Module):
    def __init__(self, config: MedusaConfig, head_weight: mx.array):
        """head_weight: (V, d) the base LM head's weight, copied into every head."""
        super().__init__()
        self.config = config
        vocab, dims = head_weight.shape
        self.blocks = [ResBlock(dims) for _ in range(config.n_heads)]
        self.heads = [nn.Linear(dims, vocab, bias=False) for _ in range(config.n_heads)]
        for head in self.heads:
            head.weight = mx.array(head_weight)

    def __call__(self, hidden: mx.array) -> mx.array:
        """(..., d) normed last hidden states -> (K, ..., V) logits of heads 1..K."""
        return mx.stack(
            [head(block(hidden)) for block, head in zip(self.blocks, self.heads, strict=True)]
        )

    def draft(self, hidden: mx.array) -> tuple[list[list[int]], list[list[float]]]:
        """(d,) hidden of the last decided token -> each head's top-k tokens, best first, and
        their probabilities."""
        logits = self(hidden).astype(mx.float32)  # (K, V)
        top = top_k_ids(logits, self.config.top_k)  # (K, k), best first
        probs = mx.take_along_axis(mx.softmax(logits, axis=-1), top, axis=-1)
        return top.tolist(), probs.tolist()


def base_head_weight(arch: Arch, dims: int) -> mx.array:
    """(V, d) the base LM head as a matrix, whatever its storage (tied, quantized)."""
    return arch.lm_head(mx.eye(dims)).T.astype(mx.float32)


def new_heads(loaded, arch: Arch, config: MedusaConfig) -> MedusaHeads:
    return MedusaHeads(config.validate(), base_head_weight(arch, loaded.config["hidden_size"]))


def save_medusa(folder: str | Path, heads: MedusaHeads, loaded, extra: dict | None = None):
    config = {
        "medusa_config": asdict(heads.config),
        "base_model": {"name": loaded.name, "fingerprint": base_fingerprint(loaded)},
        **(extra or {}),
    }
    weights = dict(tree_flatten(heads.parameters()))
    write_folder(Path(folder), weights, config, WEIGHTS, CONFIG)
    return Path(folder)


def load_medusa(folder: str | Path, loaded, arch: Arch) -> MedusaHeads:
    """Load heads trained for `loaded`'s base model; every problem is reported at once."""
    folder = Path(folder)
    if not (folder / CONFIG).is_file() or not (folder / WEIGHTS).is_file():
        raise SpecstreamError(f"not a medusa folder (needs {CONFIG} and {WEIGHTS}): {folder}")
    try:
        meta = json.loads((folder / CONFIG).read_text())
        config = MedusaConfig.from_dict(meta["medusa_config"]).validate()
    except (ValueError, KeyError, TypeError) as exc:
        raise SpecstreamError(f"{folder / CONFIG} is unreadable: {exc}") from None
    want = base_fingerprint(loaded)
    have = meta.get("base_model", {}).get("fingerprint", {})
    if have != want:
        diff = [k for k in want if have.get(k) != want[k]]
        raise SpecstreamError(
            f"medusa heads {folder} were trained for another base ({', '.join(diff)})"
        )
    heads = new_heads(loaded, arch, config)
    weights = mx.load(str(folder / WEIGHTS))
    expected = {k: v.shape for k, v in tree_flatten(heads.parameters())}
    problems = [f"missing tensor {k}" for k in expected if k not in weights]
    problems += [f"unexpected tensor {k}" for k in weights if k not in expected]
    problems += [
        f"{k}: shape {tuple(weights[k].shape)}, expected {tuple(s)}"
        for k, s in expected.items()
        if k in weights and tuple(weights[k].shape) != tuple(s)
    ]
    if problems:
        raise SpecstreamError(f"medusa folder {folder}: " + "; ".join(problems))
    heads.update(tree_unflatten(list(weights.items())))
    return heads


class MedusaDrafter:
    """Drafts for `speculative_decode(..., drafter=)`: each head's top-k tokens from the last
    decided token's hidden state, as a tree capped at max_tree_nodes by path probability (the
    same pruning rule as the streams' tree, with the heads' own probabilities)."""

    def __init__(self, heads: MedusaHeads):
        self.heads = heads

    def __call__(self, history: list[int], hidden: mx.array | None) -> Tree:
        if hidden is None:  # the first pass: nothing to draft from yet
            return draft_tree(history[-1], [])
        tokens, probs = self.heads.draft(hidden)
        tree = draft_tree(history[-1], tokens)
        cap = self.heads.config.max_tree_nodes
        if len(tree) <= cap:
            return tree
        level = [dict(zip(t, p, strict=True)) for t, p in zip(tokens, probs, strict=True)]
        transition = np.array(
            [1.0]
            + [level[d - 1][tok] for tok, d in zip(tree.tokens[1:], tree.depths[1:], strict=True)]
        )
        return subtree(tree, prune(tree, transition, 0.0, cap))
