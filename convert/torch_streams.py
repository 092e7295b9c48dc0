"""Speculative Streaming in PyTorch on Hugging Face transformers models: the stream parameters,
the multi-stream attention (MSA) layers and the tree step, computing the same thing as
specstream_mlx (decoding/tree_step.py); decoding runs the MLX runtime's own loop.

Everything that is not tensor arithmetic is shared with the MLX runtime and not re-implemented:
the decoding loop, its drafters and acceptors (decoding/host.py: this module supplies only a
`Forward`, the tensor pass over its caches), the tree (draft, pruning, ancestors), the MSA
attention mask, the stream config and prompt lookup come from specstream_mlx's mlx-free
modules. The layer loop is run here, as on the
MLX side, with the model's own modules (norms, projections, MLP, rotary embedding); attention is
computed with `scaled_dot_product_attention` under the tree's boolean mask, so it needs no
attention-mask conventions of a particular transformers version.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from specstream_mlx.decoding.host import Drafting, HostRun, drive
from specstream_mlx.decoding.lookup import LookupConfig, lookup_drafter
from specstream_mlx.decoding.policy import TreePolicy, prompt_tokens
from specstream_mlx.decoding.step import Step
from specstream_mlx.decoding.tree import Tree, msa_mask, prune
from specstream_mlx.sampling_params import SamplingParams
from specstream_mlx.streams.config import StreamConfig

PREFILL_CHUNK = 512  # prompt tokens per forward pass while prefilling (as the MLX runtime)


class LowRank(nn.Module):
    """x -> up(down(x)), down: d -> r, up: r -> d (zero at init: an untrained one adds 0).
    The MLX LowRank's a is down.weight transposed, its b is up.weight transposed."""

    def __init__(self, dims: int, rank: int):
        super().__init__()
        self.down = nn.Linear(dims, rank, bias=False)
        self.up = nn.Linear(rank, dims, bias=False)
        nn.init.normal_(self.down.weight, std=dims**-0.5)
        nn.init.zeros_(self.up.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(self.down(x))


class ParentHead(nn.Module):
    """StreamParams' ParentHead: h + b(silu(a([rms(h); rms(e)]))), x @ a as in MLX."""

    def __init__(self, dims: int, rank: int):
        super().__init__()
        self.a = nn.Parameter(torch.randn(2 * dims, rank) * (2 * dims) ** -0.5)
        self.b = nn.Parameter(torch.zeros(rank, dims))

    def forward(self, h: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        x = torch.cat([_rms(h), _rms(e)], dim=-1)
        return h + torch.nn.functional.silu(x @ self.a) @ self.b


def _rms(x: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return x * torch.rsqrt(x.float().pow(2).mean(dim=-1, keepdim=True) + eps).to(x.dtype)


class TorchStreams(nn.Module):
    """Stream identifier embeddings (gamma, d), one stream adapter per MSA layer (stream rows of
    the MLP path only) and the pruning projection o(h) = h + low_rank(h) feeding the base head
    (early exit): the parameters of specstream_mlx.streams.params.StreamParams."""

    def __init__(self, config: StreamConfig, dims: int):
        super().__init__()
        self.config = config
        self.stream_embeddings = nn.Parameter(torch.randn(config.gamma, dims) * 0.02)
        rank, layers = config.stream_adapter_rank, config.n_msa_layers
        count = layers if config.has_stream_adapters else 0
        self.adapters = nn.ModuleList(LowRank(dims, rank) for _ in range(count))
        if config.attention_adapters:  # on the stream rows' attention input, as StreamParams'
            self.attention_adapters = nn.ModuleList(LowRank(dims, rank) for _ in range(layers))
        self.prune = LowRank(dims, config.prune_rank)
        if config.next_token_guess:  # x @ guess, as StreamParams.guess
            self.guess = nn.Parameter(torch.zeros(dims, dims))
        if config.parent_rank:
            heads = (ParentHead(dims, config.parent_rank) for _ in range(config.gamma))
            self.parent_heads = nn.ModuleList(heads)

    @torch.no_grad()
    def randomize(self, seed: int) -> TorchStreams:
        """Random values for every parameter: exactness must hold for any streams."""
        gen = torch.Generator().manual_seed(seed)
        for p in self.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5)
        return self


class View:
    """The parts of a transformers causal LM the layer loop needs (a PEFT-wrapped model is
    unwrapped: its LoRA layers sit inside the base model's modules)."""

    def __init__(self, model: nn.Module):
        lm = model.get_base_model() if hasattr(model, "get_base_model") else model
        inner = lm.model
        self.embed, self.layers, self.norm = inner.embed_tokens, list(inner.layers), inner.norm
        self.rotary, self.lm_head = inner.rotary_emb, lm.lm_head
        self.device = self.embed.weight.device

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(h))

    def rope(self, x: torch.Tensor, positions: torch.Tensor):
        """(cos, sin) of shape (1, T, D) for per-token positions (T,)."""
        return self.rotary(x, positions[None])

    def tensor(self, values) -> torch.Tensor:
        return torch.as_tensor(np.asarray(values), device=self.device)


class LayerCache:
    """One layer's keys and values (1, H_kv, T, D): the decided tokens, plus the nodes of the
    pass in flight until `keep` retains the accepted path."""

    def __init__(self):
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    @property
    def offset(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]

    def append(self, keys: torch.Tensor, values: torch.Tensor):
        if self.keys is None:
            self.keys, self.values = keys, values
        else:
            self.keys = torch.cat([self.keys, keys], dim=2)
            self.values = torch.cat([self.values, values], dim=2)
        return self.keys, self.values

    def keep(self, start: int, rows: list[int]) -> None:
        """Keep this pass's rows start + rows[i] at start + i, drop the rest."""
        if rows == list(range(len(rows))):  # a prefix of the pass (a chain's accepted part)
            self.keys = self.keys[:, :, : start + len(rows)]
            self.values = self.values[:, :, : start + len(rows)]
            return
        idx = torch.arange(start, device=self.keys.device)
        idx = torch.cat([idx, torch.as_tensor(rows, device=idx.device) + start])
        self.keys, self.values = self.keys[:, :, idx], self.values[:, :, idx]


def attention(attn, x, cos, sin, mask, cache: LayerCache | None, n_main: int) -> torch.Tensor:
    """The model's attention block under a boolean mask (True: may attend). Only the first
    `n_main` rows enter the cache; the rest (stream rows) are attended to in this pass only."""
    b, t, _ = x.shape
    shape = (b, t, -1, attn.head_dim)
    q, k = attn.q_proj(x).view(shape), attn.k_proj(x).view(shape)
    if hasattr(attn, "q_norm"):  # qwen3: RMS norm over each head's dimensions
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    v = attn.v_proj(x).view(shape).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    if cache is not None:
        past_k, past_v = cache.append(k[:, :, :n_main], v[:, :, :n_main])
        k = torch.cat([past_k, k[:, :, n_main:]], dim=2)
        v = torch.cat([past_v, v[:, :, n_main:]], dim=2)
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scaling)
    return attn.o_proj(out.transpose(1, 2).reshape(b, t, -1))


def lower_layers(view: View, n_low: int, tree: Tree, caches, prefix: int) -> torch.Tensor:
    """(1, N, d): the tree's nodes through the first n_low layers (all of them cached)."""
    h = view.embed(view.tensor(tree.tokens)[None])
    positions = view.tensor(tree.depths) + prefix
    mask = np.concatenate([np.ones((len(tree), prefix), bool), tree.ancestors()], axis=1)
    mask = view.tensor(mask)
    cos, sin = view.rope(h, positions)
    for i, layer in enumerate(view.layers[:n_low]):
        cache = None if caches is None else caches[i]
        h = h + attention(
            layer.self_attn, layer.input_layernorm(h), cos, sin, mask, cache, h.shape[1]
        )
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return h


def msa_layers(
    view: View,
    streams: TorchStreams,
    main: torch.Tensor,
    depths: torch.Tensor,
    anc: np.ndarray,
    caches,
    prefix: int,
    n_streams: int | None = None,
    stream_nodes: np.ndarray | None = None,
) -> torch.Tensor:
    """main (1, M, d) at the pruning point -> (1, M + S*g, d): main rows, then the first
    g = n_streams streams of each of the S nodes in `stream_nodes` (default: all M), through the
    top layers. The mask is the MLX runtime's (decoding.tree.msa_mask)."""
    cfg = streams.config
    n_low, m = len(view.layers) - cfg.n_msa_layers, main.shape[1]
    gamma = cfg.gamma if n_streams is None else n_streams
    if cfg.main_needs_streams and gamma != cfg.gamma:
        raise ValueError("shared mode runs all gamma streams: the main stream attends to them")
    nodes = np.arange(m) if stream_nodes is None else np.asarray(stream_nodes, dtype=int)
    rows = view.tensor(nodes).long()
    s = main[0, rows, None, :] + streams.stream_embeddings[None, :gamma]  # (S, g, d)
    if cfg.next_token_guess:  # decoding.tree_step.stream_inputs
        hp = main[0, rows]
        guess = view.head(hp + streams.prune(hp)).detach().argmax(dim=-1)
        s = s + (view.embed(guess) @ streams.guess)[:, None]
    x = torch.cat([main, s.reshape(1, len(nodes) * gamma, -1)], dim=1)
    positions = torch.cat([depths, depths[rows].repeat_interleave(gamma)]) + prefix
    mask = view.tensor(msa_mask(anc, prefix, gamma, cfg.main_needs_streams, nodes))
    cos, sin = view.rope(x, positions)
    for i, layer in enumerate(view.layers[n_low:]):
        cache = None if caches is None else caches[n_low + i]
        n = layer.input_layernorm(x)
        if cfg.attention_adapters:
            n = on_stream_rows(n, n, m, streams.attention_adapters[i])
        x = x + attention(layer.self_attn, n, cos, sin, mask, cache, m)
        n = layer.post_attention_layernorm(x)
        out = x + layer.mlp(n)
        x = on_stream_rows(out, n, m, streams.adapters[i]) if cfg.has_stream_adapters else out
    return x


def on_stream_rows(y: torch.Tensor, n: torch.Tensor, m: int, adapter) -> torch.Tensor:
    """y (1, m + R, d) with adapter(n) added to its R stream rows (decoding.tree_step's)."""
    if not m:
        return y + adapter(n)
    return torch.cat([y[:, :m], y[:, m:] + adapter(n[:, m:])], dim=1)


def tree_forward(
    view: View,
    streams: TorchStreams,
    tree: Tree,
    caches: list[LayerCache],
    n_streams: int | None = None,
    cut: TreePolicy | None = None,
    vocab: list[int] | None = None,
):
    """Verify `tree` and run the first `n_streams` streams of its survivors; `cut` (a tree
    policy: threshold and node cap; None: never) prunes the tree with the early-exit head
    first. Returns (survivors, main logits (M, V), stream logits (M, g, V)), the streams'
    over `vocab` (default their adapter's draft vocabulary, if any)."""
    cfg = streams.config
    prefix = caches[0].offset
    n_low = len(view.layers) - cfg.n_msa_layers
    h = lower_layers(view, n_low, tree, caches, prefix)
    survivors = list(range(len(tree)))
    cuts = cut is not None and (len(tree) > cut.max_nodes or cut.prune_threshold > 0)
    if len(tree) > 1 and cuts:
        parents = sorted(set(tree.parents[1:]))
        hp = h[0, parents]
        probs = torch.softmax(view.head(hp + streams.prune(hp)).float(), dim=-1)  # (P, V)
        row = {p: i for i, p in enumerate(parents)}
        picked = probs[[row[p] for p in tree.parents[1:]], tree.tokens[1:]]
        transition = np.concatenate([[1.0], picked.cpu().numpy()])
        survivors = prune(tree, transition, cut.prune_threshold, cut.max_nodes)
    m, gamma = len(survivors), cfg.gamma if n_streams is None else n_streams
    anc = tree.ancestors()[np.ix_(survivors, survivors)]
    kept = view.tensor(survivors).long()
    depths = view.tensor(tree.depths)[kept]
    x = msa_layers(view, streams, h[:, kept], depths, anc, caches, prefix, gamma)
    if (cfg.parent_rank or cfg.draft_vocab is not None) and gamma:  # tree_step.stream_logits
        main, hidden = view.head(x[0, :m]), x[0, m:].reshape(m, gamma, -1)
        return survivors, main, stream_logits(view, streams, hidden, main, vocab)
    logits = view.head(x[0])  # (M (1 + g), V): one head pass for main and stream rows
    return survivors, logits[:m], logits[m:].reshape(m, gamma, -1)


def stream_logits(view: View, streams: TorchStreams, hidden, main, vocab=None):
    """(M, g, d) -> (M, g, V), over `vocab` (default the adapter's draft vocabulary, if any);
    with parent heads stream 1 reads the main stream's greedy token at each node, stream j
    stream j - 1's best token, one stream after the other."""
    if not streams.config.parent_rank:
        return draft_head(view, streams, hidden, vocab)
    parents, out = main.argmax(dim=-1), []
    for j in range(hidden.shape[1]):
        h = streams.parent_heads[j](hidden[:, j], view.embed(parents))
        out.append(draft_head(view, streams, h, vocab))
        parents = out[-1].argmax(dim=-1)
    return torch.stack(out, dim=1)


def draft_head(view: View, streams: TorchStreams, h: torch.Tensor, vocab=None) -> torch.Tensor:
    """The head's logits of stream states: -inf outside `vocab` (default the adapter's draft
    vocabulary, StreamConfig.draft_vocab; the whole head's logits masked: the same drafts as
    MLX's head over its columns, at the whole head's cost)."""
    logits = view.head(h)
    vocab = vocab or streams.config.draft_vocab
    if vocab is None:
        return logits
    outside = torch.full((logits.shape[-1],), float("-inf"), device=h.device, dtype=logits.dtype)
    outside[list(vocab)] = 0.0
    return logits + outside


def chain(tokens: list[int]) -> Tree:
    return Tree(list(tokens), list(range(-1, len(tokens) - 1)), list(range(len(tokens))))


def prefill(view: View, streams: TorchStreams | None, tokens: list[int], caches) -> None:
    """Run prompt tokens into the caches, PREFILL_CHUNK per pass. A shared-mode model whose
    prompt tokens carry streams (prompt_streams) runs them with their streams."""
    with_streams = streams is not None and streams.config.main_needs_streams
    with_streams = with_streams and streams.config.prompt_streams
    for start in range(0, len(tokens), PREFILL_CHUNK):
        piece = chain(tokens[start : start + PREFILL_CHUNK])
        prefix = caches[0].offset
        if not with_streams:
            lower_layers(view, len(view.layers), piece, caches, prefix)
            continue
        n_low = len(view.layers) - streams.config.n_msa_layers
        h = lower_layers(view, n_low, piece, caches, prefix)
        depths = view.tensor(piece.depths)
        msa_layers(view, streams, h, depths, piece.ancestors(), caches, prefix)


class TorchForward:
    """decoding.host's Forward over this module's tensor pass and caches."""

    def __init__(self, view: View, streams: TorchStreams, caches: list, n_streams, vocab=None):
        self.view, self.streams, self.caches, self.n_streams = view, streams, caches, n_streams
        self.n_low = len(view.layers) - streams.config.n_msa_layers
        self.vocab = vocab  # the streams' draft vocabulary in this generation (None: the adapter's)

    def offset(self) -> int:
        return self.caches[0].offset

    def verify(self, tree: Tree, cut: TreePolicy | None, drafts: bool) -> TorchVerified:
        out = tree_forward(
            self.view, self.streams, tree, self.caches, self.n_streams, cut, self.vocab
        )
        return TorchVerified(*out)

    def keep(self, offset: int, nodes: list[int], path: list[int]) -> None:
        for i, cache in enumerate(self.caches):  # below the MSA layers every node was cached
            cache.keep(offset, nodes if i < self.n_low else path)


class TorchVerified:
    """decoding.host's Verified: one tree step's logits, read back on demand."""

    def __init__(self, survivors: list[int], main: torch.Tensor, streams: torch.Tensor):
        self.survivors, self.main, self.streams = survivors, main, streams

    def greedy(self, k: int) -> list[int]:
        return self.main.argmax(dim=-1).tolist()

    def target(self, sampling: SamplingParams):
        target = probabilities(self.main, sampling).double().cpu().numpy()
        return lambda n: target[n]

    def stream_top(self, m: int, k: int) -> list[list[int]]:
        return top_k_ids(self.streams[m], k).tolist()

    def stream_probs(self, m: int, depth: int, sampling: SamplingParams) -> np.ndarray:
        return probabilities(self.streams[m, :depth], sampling).double().cpu().numpy()

    def hidden(self, m: int):
        return None


@torch.inference_mode()
def speculative_decode(
    model: nn.Module,
    streams: TorchStreams,
    prompt_ids: list[int],
    max_tokens: int,
    draft: bool = True,
    lookup: LookupConfig | None = None,
    draft_override=None,
    sampling: SamplingParams | None = None,
    policy: TreePolicy | None = None,
) -> Iterator[Step]:
    """Speculative Streaming with the MLX runtime's loop (decoding.host) over this module's
    tensor pass: each pass verifies the previous draft and drafts the next one from the streams
    of the last accepted node (the streams' own tree policy). draft=False decides one token per
    pass with the streams still computed (plain decoding of a shared-mode model, whose main
    stream attends to its own streams). `lookup` drafts the prompt lookup chain instead of the
    streams' tree whenever the context has a match. `draft_override` (a test hook, greedy
    only): given the tokens decided so far, the tokens each stream should propose. With
    `sampling` (a temperature) the drafts are drawn from the streams' distributions and
    verified by tree rejection sampling (no pruning: the tree's shape is fixed in advance).
    `policy`: the tree to draft (default: the streams' own, TreePolicy.of their config)."""
    sampling = sampling or SamplingParams()
    if draft_override is not None and not sampling.greedy:
        raise ValueError("draft_override is for greedy decoding")
    view, cfg = View(model), streams.config
    policy = (policy or TreePolicy.of(cfg)) if draft else TreePolicy()
    drafter = lookup_drafter(lookup) if lookup is not None and draft else None
    drafting = Drafting(policy, True, drafter, draft_override)
    n_streams = cfg.gamma if cfg.main_needs_streams else max(policy.depth, 1)
    caches = [LayerCache() for _ in view.layers]
    prefill(view, streams, prompt_ids[:-1], caches)
    vocab = None  # the adapter's draft vocabulary and the prompt's tokens, as in decoding.loop
    if cfg.draft_vocab is not None and drafter is None:
        vocab = [*cfg.draft_vocab, *prompt_tokens(cfg.draft_vocab, prompt_ids)]
    forward = TorchForward(view, streams, caches, n_streams, vocab)
    yield from drive(HostRun(forward, drafting, list(prompt_ids), sampling), max_tokens)


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """(..., V) logits -> float32 probabilities after temperature, top-k and top-p: the MLX
    runtime's `sampling.probabilities`."""
    logits = logits.float() / params.temperature
    if 0 < params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1:  # ties with the last kept token are kept too, as on the MLX side
        sorted_probs = torch.sort(probs, dim=-1, descending=True).values
        keep = (torch.cumsum(sorted_probs, dim=-1) - sorted_probs) < params.top_p
        last = keep.long().sum(dim=-1, keepdim=True) - 1
        cutoff = torch.gather(sorted_probs, -1, last)
        probs = probs.masked_fill(probs < cutoff, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def top_k_ids(logits: torch.Tensor, k: int) -> torch.Tensor:
    """(..., V) -> (..., k) best token ids per row, best first."""
    return torch.topk(logits, k, dim=-1).indices


def decode_until_eos(steps: Iterator[Step], eos_ids: set[int]) -> tuple[list[int], int]:
    """Tokens of a decoder's steps up to and including the first EOS, and the passes taken."""
    tokens, passes = [], 0
    for step in steps:
        passes += 1
        for token in step.tokens:
            tokens.append(token)
            if token in eos_ids:
                return tokens, passes
    return tokens, passes


@torch.inference_mode()
def hf_greedy(model: nn.Module, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """Plain greedy decoding through the model's own forward and KV cache (transformers'
    attention and RoPE, none of this module's code): the reference the lossless decoder must
    reproduce. No EOS stop: exactly `max_tokens` tokens."""
    device = next(model.parameters()).device
    ids = torch.as_tensor([prompt_ids], device=device)
    out = model(input_ids=ids, use_cache=True)
    # transformers 5.x renamed the KV cache `cache` (argument and output); 4.x: past_key_values
    cache = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    tokens = []
    for _ in range(max_tokens):
        token = int(out.logits[0, -1].argmax())
        tokens.append(token)
        if len(tokens) == max_tokens:
            break
        nxt = torch.as_tensor([[token]], device=device)
        out = model(input_ids=nxt, use_cache=True, **{cache: out[cache]})
    return tokens
