"""One forward pass over a draft tree: verify it with the main stream and run the speculative
streams of every surviving node (paper eqs. 2, 4, 5). The decoder runs the layer loop itself
because mlx-lm models build their own causal mask inside `__call__`."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from ..errors import SpecstreamError
from ..models.arch import Arch
from ..streams.params import StreamParams
from . import policy
from .kv import MainOnlyCache
from .tree import Tree, msa_mask
from .tree import prune as prune_tree

# Up to this many rows, main and stream logits come from one LM-head pass: the head's weights
# are read once (the pass is memory-bound on a CPU), instead of once for the main stream and
# once more for the accepted node's streams after verification.
ONE_HEAD_PASS_ROWS = 64


def one_head_pass(params: StreamParams | None, rows: int) -> bool:
    """Whether the main and stream logits of `rows` rows come from one head pass: up to
    ONE_HEAD_PASS_ROWS, unless the streams read their parent's token (parent heads), which
    the main stream's logits decide first, or draft from a vocabulary of their own (a head
    pass of its own, over fewer columns)."""
    if params is None:
        return rows <= ONE_HEAD_PASS_ROWS
    cfg = params.config
    return rows <= ONE_HEAD_PASS_ROWS and not cfg.parent_rank and cfg.draft_vocab is None


@dataclass
class DraftVocab:
    """The head the streams draft with: the LM head's columns of the adapter's draft vocabulary
    (StreamConfig.draft_vocab)."""

    ids: mx.array  # (K,) uint32
    columns: mx.array  # (d, K)
    size: int  # the whole vocabulary's

    @classmethod
    def of(cls, arch: Arch, params: StreamParams) -> DraftVocab | None:
        """`params`' draft head for `arch`, made once (eagerly: before any compiled trace reads
        it; `Passes` and `read_adapter` ask first). None: the streams use the whole head."""
        if params.config.draft_vocab is None:
            return None
        if params.draft is None:
            ids = mx.array(params.config.draft_vocab, dtype=mx.uint32)
            columns = arch.head_columns(ids)
            size = arch.lm_head(mx.zeros((1, arch.dims), columns.dtype)).shape[-1]
            if int(ids[-1].item()) >= size:
                raise SpecstreamError(
                    f"draft_vocab names token {int(ids[-1].item())}: the model has {size}"
                )
            mx.eval(columns)
            params.draft = cls(ids, columns, size)
        return params.draft

    def with_prompt(self, arch: Arch, prompt_ids: list[int]) -> DraftVocab:
        """This vocabulary and the prompt's tokens outside it (policy.prompt_tokens), padded to
        exactly PROMPT_SLOTS more ids (repeating one: its logit lands in one place), so that
        every prompt gives the same shape and the compiled passes one trace."""
        own = np.array(self.ids).tolist()
        extra = policy.prompt_tokens(own, prompt_ids)
        extra += [own[-1]] * (policy.PROMPT_SLOTS - len(extra))
        added = mx.array(extra, dtype=mx.uint32)
        ids = mx.concatenate([self.ids, added])
        columns = mx.concatenate([self.columns, arch.head_columns(added)], axis=1)
        mx.eval(ids, columns)
        return DraftVocab(ids, columns, self.size)

    def logits(self, x: mx.array) -> mx.array:
        """(..., d) normed hidden -> (..., V) logits: the head's over the vocabulary, -inf
        elsewhere (never drafted; softmax gives them probability 0)."""
        small = x @ self.columns
        out = mx.full((*x.shape[:-1], self.size), -mx.inf, small.dtype)
        out[..., self.ids] = small
        return out


def _draft_head(arch: Arch, params: StreamParams, x: mx.array, vocab: DraftVocab | None):
    vocab = vocab or DraftVocab.of(arch, params)
    return arch.lm_head(x) if vocab is None else vocab.logits(x)


@dataclass
class TreeOutput:
    survivors: list[int]  # tree node indices that entered the MSA layers
    main_logits: mx.array  # (M, V) main-stream logits of the survivors
    stream_hidden: mx.array | None  # (M, gamma, d) last hidden states of their streams
    stream_logits: mx.array | None = None  # (M, drafted, V) from the same head pass, when it was
    main_hidden: mx.array | None = None  # (M, d) normed last hidden (verify_forward: drafters')

    def streams_of(
        self, arch: Arch, params: StreamParams, m: int, vocab: DraftVocab | None = None
    ) -> mx.array:
        """Survivor m's stream logits: (drafted, V) from the head pass, else (gamma, V) over
        `vocab` (default the streams' own draft vocabulary)."""
        if self.stream_logits is not None:
            return self.stream_logits[m]
        root = mx.argmax(self.main_logits[m : m + 1], axis=-1)
        return stream_logits(arch, params, self.stream_hidden[m : m + 1], root, vocab)[0]


def stream_logits(
    arch: Arch,
    params: StreamParams,
    hidden: mx.array,
    parents: mx.array,
    vocab: DraftVocab | None = None,
):
    """(M, g, d) streams' last hidden states -> (M, g, V) logits, -inf outside `vocab`
    (default the streams' own draft vocabulary, if any). With parent heads (`parent_rank`)
    stream j reads the token before its target: `parents` (M,), the main stream's greedy
    token at each node (stream 1's), then stream j - 1's best token, one stream after the
    other (the chain of the tree's first children). Training feeds each stream its true
    parent instead (training.forward)."""
    if not params.config.parent_rank:
        return _draft_head(arch, params, arch.norm(hidden), vocab)
    out = []
    for j, head in enumerate(params.parent_heads[: hidden.shape[1]]):
        x = arch.norm(head(hidden[:, j], arch.embed(parents)))
        out.append(_draft_head(arch, params, x, vocab))
        parents = mx.argmax(out[-1], axis=-1)
    return mx.stack(out, axis=1)


def _lower_mask(tree: Tree, prefix: int) -> mx.array:
    anc = tree.ancestors()  # (N, N)
    return mx.array(np.concatenate([np.ones((len(tree), prefix), bool), anc], axis=1))


def _msa_mask(
    anc: np.ndarray, prefix: int, gamma: int, shared: bool, stream_nodes: np.ndarray | None = None
) -> mx.array:
    return mx.array(msa_mask(anc, prefix, gamma, shared, stream_nodes))


def _lower_layers(arch: Arch, n_low: int, tree: Tree, caches: list, prefix: int) -> mx.array:
    """(1, N, d): every tree node through the layers below the pruning point (all cached)."""
    h = arch.embed(mx.array(tree.tokens)[None])  # (1, N, d)
    layers = zip(arch.layers[:n_low], caches[:n_low], strict=True)
    if tree.is_chain():  # consecutive tokens: the model's own causal path, as in plain decoding
        mask = "causal" if len(tree) > 1 else None
        for layer, cache in layers:
            h = layer(h, mask, cache)
        return h
    mask = _lower_mask(tree, prefix)
    with arch.positions(mx.array(tree.depths) + prefix):
        for layer, cache in layers:
            h = layer(h, mask, cache)
    return h


@dataclass
class MsaRows:
    """Where the MSA layers' rows sit: the M nodes' depths (M,), the cached prefix length (an
    int, or an array inside compiled passes), the nodes whose streams run (default: all) and
    the attention mask over prefix | M main | streams columns."""

    depths: mx.array
    prefix: int | mx.array
    mask: mx.array
    stream_nodes: np.ndarray | None = None

    @classmethod
    def of(cls, depths, anc: np.ndarray, prefix: int, gamma: int, shared: bool, nodes=None):
        mask = _msa_mask(anc, prefix, gamma, shared, nodes)
        return cls(depths, prefix, mask, nodes)


def msa_layers(
    arch: Arch,
    params: StreamParams,
    main: mx.array,
    rows: MsaRows,
    caches: list | None,
    n_streams: int | None = None,
) -> mx.array:
    """main (1, M, d) hidden of M nodes at the pruning point -> (1, M + S*g, d): main rows,
    then the first g = n_streams (default gamma) streams of each of the S nodes in
    `rows.stream_nodes` (default: all M). Stream j sees only streams 1..j, so fewer streams
    leave the first ones unchanged; a main stream that reads the streams (main_needs_streams)
    sees them all, so it needs all gamma (g = 0, otherwise only: the main rows alone, as the
    model alone runs them). Only main rows enter the caches; caches=None runs without any
    (training)."""
    cfg = params.config
    n_low, m = len(arch.layers) - cfg.n_msa_layers, main.shape[1]
    gamma = cfg.gamma if n_streams is None else n_streams
    if cfg.main_needs_streams and gamma != cfg.gamma:
        raise ValueError("all gamma streams run where the main stream attends to them")
    x, positions = main, rows.depths + rows.prefix
    if gamma:
        nodes = np.arange(m) if rows.stream_nodes is None else np.asarray(rows.stream_nodes, int)
        picked = mx.array(nodes)
        x = mx.concatenate([main, stream_inputs(arch, params, main[0, picked], gamma)], axis=1)
        positions = mx.concatenate([rows.depths, mx.repeat(rows.depths[picked], gamma)])
        positions = positions + rows.prefix
    views = None if caches is None else [MainOnlyCache(c, m) for c in caches[n_low:]]
    with arch.positions(positions):
        return msa_block(arch, params, x, m, rows.mask, views)


def stream_inputs(arch: Arch, params: StreamParams, h: mx.array, gamma: int) -> mx.array:
    """(S, d) hidden states of S nodes at the pruning point -> (1, S * gamma, d): the initial
    state of their first gamma streams (the node's state plus each stream's embedding, plus,
    with `next_token_guess`, the projected embedding of the early-exit head's next token)."""
    streams = h[:, None, :] + params.stream_embeddings[None, :gamma]  # (S, g, d)
    if params.config.next_token_guess:
        streams = streams + (arch.embed(early_exit_guess(arch, params, h)) @ params.guess)[:, None]
    return streams.reshape(1, h.shape[0] * gamma, -1)


def early_exit_guess(arch: Arch, params: StreamParams, h: mx.array) -> mx.array:
    """(S,) the early-exit head's greedy next token for S hidden states at the pruning point."""
    logits = arch.lm_head(arch.norm(h + params.prune(h)))
    return mx.argmax(mx.stop_gradient(logits), axis=-1)


def msa_block(arch: Arch, params: StreamParams, x: mx.array, m: int, mask, caches) -> mx.array:
    """The MSA layers (the one home of the block that decoding, compiled passes and training
    run): x (1, m + R, d), m main rows then R stream rows, at the positions the caller set
    (arch.positions); `caches` one per MSA layer (None: no cache), `mask` over the cached
    columns then x's rows. The stream adapters act on the stream rows only: on the MLP path,
    and with `attention_adapters` on the attention's input as well."""
    cfg = params.config
    n_low = len(arch.layers) - cfg.n_msa_layers
    for i, layer in enumerate(arch.layers[n_low:]):
        cache = None if caches is None else caches[i]
        n = layer.input_layernorm(x)
        if cfg.attention_adapters:
            n = on_stream_rows(n, n, m, params.attention_adapters[i])
        x = x + layer.self_attn(n, mask, cache)
        n = layer.post_attention_layernorm(x)
        out = x + layer.mlp(n)
        x = on_stream_rows(out, n, m, params.adapters[i]) if cfg.has_stream_adapters else out
    return x


def on_stream_rows(y: mx.array, n: mx.array, m: int, adapter) -> mx.array:
    """y (1, m + R, d) with adapter(n) added to its R stream rows (the m main rows unchanged)."""
    if y.shape[1] == m:  # no stream rows
        return y
    if not m:
        return y + adapter(n)
    return mx.concatenate([y[:, :m], y[:, m:] + adapter(n[:, m:])], axis=1)


def tree_forward(
    arch: Arch,
    params: StreamParams | None,
    tree: Tree,
    caches: list,
    n_streams: int | None = None,
    stream_logits: bool = True,
    prune=None,
) -> TreeOutput:
    """Verify `tree` at the caches' offset and run the first `n_streams` (default gamma) streams
    of its survivors; params=None verifies with the model alone (every node a survivor, the
    normed hidden states kept for drafters that read them). stream_logits=False skips the head
    on the stream rows: nothing will be drafted from them. `prune` (a decoding.policy
    TreePolicy: threshold and node cap) cuts the tree with the early-exit head first."""
    prefix = caches[0].offset
    if params is None:
        h = arch.norm(_lower_layers(arch, len(arch.layers), tree, caches, prefix)[0])  # (N, d)
        return TreeOutput(list(range(len(tree))), arch.lm_head(h), None, main_hidden=h)
    cfg = params.config
    n_low = len(arch.layers) - cfg.n_msa_layers
    h = _lower_layers(arch, n_low, tree, caches, prefix)

    survivors = list(range(len(tree)))
    # The early-exit head is only needed when something can be cut.
    if (
        prune is not None
        and len(tree) > 1
        and (len(tree) > prune.max_nodes or prune.prune_threshold > 0)
    ):
        # Early-exit transition probabilities parent -> child from the pruning head.
        parents = sorted({p for p in tree.parents[1:]})
        z = arch.lm_head(arch.norm(h[0, parents] + params.prune(h[0, parents])))  # (P, V)
        probs = mx.softmax(z.astype(mx.float32), axis=-1)
        row = {p: i for i, p in enumerate(parents)}
        rows = mx.array([row[p] for p in tree.parents[1:]])
        cols = mx.array(tree.tokens[1:])
        transition = np.concatenate([[1.0], np.array(probs[rows, cols])])
        survivors = prune_tree(tree, transition, prune.prune_threshold, prune.max_nodes)

    m, gamma = len(survivors), cfg.gamma if n_streams is None else n_streams
    kept = mx.array(survivors)
    anc = tree.ancestors()[np.ix_(survivors, survivors)]
    depths = mx.array(tree.depths)[kept]
    rows = MsaRows.of(depths, anc, prefix, gamma, cfg.main_needs_streams)
    x = msa_layers(arch, params, h[:, kept], rows, caches, gamma)
    if not gamma:  # the streams sat this pass out (lossless)
        return TreeOutput(survivors, arch.lm_head(arch.norm(x[0])), None)
    stream_hidden = x[0, m:].reshape(m, gamma, -1)
    if stream_logits and one_head_pass(params, m * (1 + gamma)):
        logits = arch.lm_head(arch.norm(x[0]))  # (M(1+gamma), V)
        return TreeOutput(survivors, logits[:m], stream_hidden, logits[m:].reshape(m, gamma, -1))
    main_logits = arch.lm_head(arch.norm(x[0, :m]))  # (M, V)
    return TreeOutput(survivors, main_logits, stream_hidden)


def prefill_with_streams(arch: Arch, params: StreamParams, piece: list[int], caches: list) -> None:
    """Shared mode with prompt_streams: a token's main stream attends to its own streams in the
    MSA layers, so the prompt's tokens run with their streams too: `piece` as a chain, in one
    pass (lazily: the caller evaluates the caches)."""
    n_low = len(arch.layers) - params.config.n_msa_layers
    chain = Tree(piece, list(range(-1, len(piece) - 1)), list(range(len(piece))))
    prefix = caches[0].offset
    h = _lower_layers(arch, n_low, chain, caches, prefix)
    depths = mx.array(chain.depths)
    main_reads = params.config.main_needs_streams
    rows = MsaRows.of(depths, chain.ancestors(), prefix, params.config.gamma, main_reads)
    msa_layers(arch, params, h, rows, caches)
