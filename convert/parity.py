"""The two runtimes side by side on the same weights and adapter (needs MLX and torch): what the
parity tests and benchmarks/torch_parity.py compare."""

from __future__ import annotations

import numpy as np
import torch

from specstream_mlx.decoding import tree_step
from specstream_mlx.decoding.loop import Decoder, decode, prefilled
from specstream_mlx.decoding.policy import TreePolicy
from specstream_mlx.decoding.tree import Tree
from specstream_mlx.models.arch import arch_of

from .torch_streams import LayerCache, View, prefill, speculative_decode, tree_forward


def one_tree_step(loaded, params, base, streams, prompt: list[int], tree: Tree):
    """One tree step after the same prefill: (MLX TreeOutput, torch survivors, torch main
    logits (M, V), torch stream logits (M, gamma, V)) as numpy for torch."""
    arch = arch_of(loaded.model, loaded.config["model_type"])
    caches = prefilled(Decoder(loaded.model, arch, params), prompt).caches
    prune = TreePolicy.of(params.config)
    out = tree_step.tree_forward(arch, params, tree, caches, prune=prune)
    view = View(base.model)
    torch_caches = [LayerCache() for _ in view.layers]
    with torch.inference_mode():
        prefill(view, streams, prompt[:-1], torch_caches)
        survivors, main, stream = tree_forward(view, streams, tree, torch_caches, cut=prune)
    return out, survivors, main.float().cpu().numpy(), stream.float().cpu().numpy()


def mlx_stream_logits(loaded, params, out) -> np.ndarray:
    """An MLX TreeOutput's stream logits (M, gamma, V), as numpy: from its head pass, or each
    survivor's own (parent heads read the main stream's token first)."""
    if out.stream_logits is not None:
        return np.array(out.stream_logits)
    arch = arch_of(loaded.model, loaded.config["model_type"])
    return np.stack([np.array(out.streams_of(arch, params, m)) for m in range(len(out.survivors))])


def decode_both(loaded, params, base, streams, prompt: list[int], n: int, **kw):
    """Greedy speculative decoding of `n` tokens in each runtime: (MLX steps, torch steps)."""
    arch = arch_of(loaded.model, loaded.config["model_type"])
    m = list(decode(Decoder(loaded.model, arch, params, TreePolicy.of(params.config)), prompt, n))
    t = list(speculative_decode(base.model, streams, prompt, n, **kw))
    return m, t


def max_diff(a, b) -> float:
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())
