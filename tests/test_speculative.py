"""Speculative Streaming core: lossless output equals plain greedy decoding, exactly."""

import json
import re

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache

import specstream_mlx as ss
from specstream_mlx.decoding import policy, tree_step
from specstream_mlx.decoding.loop import Decoder, decode
from specstream_mlx.decoding.policy import TreePolicy
from specstream_mlx.decoding.tree import draft_tree
from specstream_mlx.decoding.tree_step import tree_forward
from specstream_mlx.generate import encode_prompt
from specstream_mlx.models.arch import arch_of
from specstream_mlx.streams.adapter_io import load_adapter, save_adapter
from specstream_mlx.streams.config import StreamConfig
from specstream_mlx.streams.params import StreamParams

from .tiny import FAMILIES, draft_vocab


@pytest.fixture(scope="module")
def tiny_models(tiny_folders):
    return {family: ss.load(str(folder)) for family, folder in tiny_folders.items()}


def streams_for(loaded, seed=0, **config):
    cfg = StreamConfig(**config).validate(loaded.config["num_hidden_layers"])
    return StreamParams(cfg, loaded.config["hidden_size"]).randomize(seed)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    family=st.sampled_from(sorted(FAMILIES)),
    gamma=st.integers(1, 4),
    top_k=st.integers(1, 3),
    n_msa=st.integers(1, 3),
    threshold=st.sampled_from([0.0, 1e-4, 1e-2, 0.2]),
    cap=st.integers(1, 40),
    prompt=st.text(min_size=1, max_size=30).filter(str.strip),
    length=st.integers(1, 24),
    seed=st.integers(0, 1000),
    guess=st.booleans(),
    attn=st.booleans(),
    parent=st.sampled_from([0, 4]),
    vocab=st.booleans(),
)
def test_lossless_equals_plain_greedy(
    tiny_models,
    family,
    gamma,
    top_k,
    n_msa,
    threshold,
    cap,
    prompt,
    length,
    seed,
    guess,
    attn,
    parent,
    vocab,
):
    loaded = tiny_models[family]
    params = streams_for(
        loaded,
        seed,
        gamma=gamma,
        top_k=top_k,
        n_msa_layers=n_msa,
        prune_threshold=threshold,
        max_tree_nodes=cap,
        next_token_guess=guess,
        attention_adapters=attn,
        parent_rank=parent,
        draft_vocab=draft_vocab(loaded, seed) if vocab else None,
    )
    plain = ss.generate(loaded, prompt, max_tokens=length)
    spec = ss.generate(loaded, prompt, max_tokens=length, decoder="ss", streams=params)
    assert spec.token_ids == plain.token_ids
    assert spec.finish_reason == plain.finish_reason
    assert spec.stats.accepted_tokens == plain.stats.accepted_tokens
    assert spec.stats.forward_passes <= plain.stats.forward_passes


@pytest.mark.parametrize("kv_bits", [4, 8])
def test_lossless_with_quantized_kv_cache(tiny_folders, kv_bits, tmp_path):
    from .tiny import save_tiny_model

    loaded = ss.load(str(save_tiny_model(tmp_path / "m", "qwen2", hidden_size=128)))
    params = streams_for(loaded, 5, gamma=3, top_k=2, n_msa_layers=2, max_tree_nodes=8)
    plain = ss.generate(loaded, "quantized cache", max_tokens=20, kv_bits=kv_bits)
    spec = ss.generate(
        loaded, "quantized cache", max_tokens=20, kv_bits=kv_bits, decoder="ss", streams=params
    )
    assert spec.token_ids == plain.token_ids


PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about autumn.",
    "List three prime numbers and explain why they are prime.",
]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_default_model_lossless(default_model, prompt):
    params = streams_for(default_model, 1)  # paper defaults: gamma 4, N_s 4, top-k 3, 32 nodes
    plain = ss.generate(default_model, prompt, max_tokens=20)
    spec = ss.generate(default_model, prompt, max_tokens=20, decoder="ss", streams=params)
    assert spec.token_ids == plain.token_ids


def path_logits(loaded, prefix, tree, node):
    path = []
    while node >= 0:
        path.append(tree.tokens[node])
        node = tree.parents[node]
    return loaded.model(mx.array(prefix + path[::-1])[None])[0, -1]


@pytest.mark.parametrize("cap", [200, 7])
def test_every_node_logits_equal_its_path_run_causally(tiny_models, cap):
    loaded = tiny_models["llama"]
    arch = arch_of(loaded.model, "llama")
    params = streams_for(loaded, 2, gamma=3, top_k=2, n_msa_layers=2, max_tree_nodes=cap)
    prefix = [10, 20, 30, 40, 50]
    caches = make_prompt_cache(loaded.model)
    loaded.model(mx.array(prefix)[None], cache=caches)
    tree = draft_tree(60, [[70, 71], [80, 81], [90, 91]])
    out = tree_forward(arch, params, tree, caches, prune=TreePolicy.of(params.config))
    assert len(out.survivors) == min(cap, len(tree))
    for m, node in enumerate(out.survivors):
        diff = mx.abs(out.main_logits[m] - path_logits(loaded, prefix, tree, node)).max().item()
        assert diff <= 1e-4, (node, diff)


def run_steps(loaded, params, prompt_ids, max_tokens, override=None):
    arch = arch_of(loaded.model, loaded.config["model_type"])
    policy = TreePolicy.of(params.config)
    dec = Decoder(loaded.model, arch, params, policy, override=override)
    return decode(dec, prompt_ids, max_tokens)


def test_compacted_cache_equals_plain_cache_and_streams_store_nothing(tiny_models, monkeypatch):
    loaded = tiny_models["phi3"]
    params = streams_for(loaded, 3, gamma=3, top_k=2, n_msa_layers=2, max_tree_nodes=10)
    prompt = encode_prompt(loaded, "compaction check")
    seen = {}
    import specstream_mlx.decoding.loop as spec_mod

    real_make_cache = spec_mod.make_cache
    monkeypatch.setattr(
        spec_mod, "make_cache", lambda *a: seen.setdefault("caches", real_make_cache(*a))
    )
    decided = []
    for step in run_steps(loaded, params, prompt, 30):
        decided += step.tokens
        offsets = {c.offset for c in seen["caches"]}
        assert offsets == {len(prompt) - 1 + len(decided)}  # streams add no entries
    reference = make_prompt_cache(loaded.model)
    loaded.model(mx.array(prompt + decided[:-1])[None], cache=reference)
    for ours, ref in zip(seen["caches"], reference, strict=True):
        n = ref.offset
        assert mx.abs(ours.keys[..., :n, :] - ref.keys[..., :n, :]).max().item() <= 1e-4
        assert mx.abs(ours.values[..., :n, :] - ref.values[..., :n, :]).max().item() <= 1e-4


def test_compaction_moves_kept_rows_in_plain_and_quantized_caches():
    """decoding.kv.compact: rows start + keep[i] land at start + i in every array of a plain
    cache and of quantized ones (their parts a tuple, or the list mlx-lm gives a filled cache);
    a keep that is already a prefix moves nothing; offsets follow the keeps."""
    from mlx_lm.models.cache import KVCache

    from specstream_mlx.decoding.kv import compact

    def filled(seed):
        cache = KVCache()
        keys, values = (
            mx.random.normal((1, 2, 10, 32), key=mx.random.key(seed + i)) for i in (0, 1)
        )
        cache.update_and_fetch(keys, values)
        return cache

    listed = filled(1).to_quantized(group_size=32, bits=8)
    as_tuple = filled(2).to_quantized(group_size=32, bits=8)
    as_tuple.keys, as_tuple.values = tuple(as_tuple.keys), tuple(as_tuple.values)
    caches = [filled(0), listed, as_tuple, filled(3)]
    keeps = [[0, 2, 5], [0, 2, 5], [1, 3], [0, 1]]

    def parts(cache):
        return [
            x
            for kv in (cache.keys, cache.values)
            for x in (kv if isinstance(kv, (tuple, list)) else [kv])
        ]

    before = [[np.array(x) for x in parts(c)] for c in caches]
    kinds = [type(c.keys) for c in caches]
    compact(caches, 4, keeps)
    for cache, keep, old, kind in zip(caches, keeps, before, kinds, strict=True):
        assert cache.offset == 4 + len(keep) and type(cache.keys) is kind
        for now, was in zip(parts(cache), old, strict=True):
            want = was.copy()
            want[..., 4 : 4 + len(keep), :] = was[..., [4 + k for k in keep], :]
            assert np.array_equal(np.array(now), want)


def test_oracle_draft_reaches_gamma_plus_one(tiny_models):
    loaded = tiny_models["qwen3"]
    gamma = 4
    params = streams_for(loaded, 4, gamma=gamma, top_k=1, n_msa_layers=2)
    prompt = encode_prompt(loaded, "oracle")
    saved_eos = set(loaded.eos_token_ids)
    loaded.eos_token_ids.clear()  # a fixed 40-token run: no early stop
    try:
        truth = ss.generate(loaded, prompt, max_tokens=40).token_ids

        def oracle(history):
            done = len(history) - len(prompt)  # history[-1] is the next root
            return [[truth[done + j] if done + j < len(truth) else 0] for j in range(gamma)]

        steps = list(run_steps(loaded, params, prompt, 40, oracle))
    finally:
        loaded.eos_token_ids.update(saved_eos)
    assert [t for s in steps for t in s.tokens] == truth
    assert [len(s.tokens) for s in steps[1:-1]] == [gamma + 1] * (len(steps) - 2)


def test_capped_chain_drafts_only_what_survives(tiny_models, monkeypatch):
    """k=1 capped at N nodes: only the first N-1 streams are drafted and computed (nothing is
    cut after the lower layers), and an oracle still gets N tokens per pass, exactly."""
    loaded = tiny_models["llama"]
    params = streams_for(loaded, 6, gamma=4, top_k=1, n_msa_layers=2, max_tree_nodes=3)
    prompt = encode_prompt(loaded, "capped chain")
    rows = []
    real = tree_step.msa_layers
    monkeypatch.setattr(
        tree_step,
        "msa_layers",
        lambda *a, **k: rows.append(a[-1]) or real(*a, **k),
    )
    saved_eos = set(loaded.eos_token_ids)
    loaded.eos_token_ids.clear()
    try:
        truth = ss.generate(loaded, prompt, max_tokens=30).token_ids

        def oracle(history):
            done = len(history) - len(prompt)  # history[-1] is the next root
            return [[truth[done + j] if done + j < len(truth) else 0] for j in range(4)]

        steps = list(run_steps(loaded, params, prompt, 30, oracle))
        random_streams = list(run_steps(loaded, params, prompt, 30, None))
    finally:
        loaded.eos_token_ids.update(saved_eos)
    assert [t for s in steps for t in s.tokens] == truth
    assert [t for s in random_streams for t in s.tokens] == truth
    assert all(s.tree_nodes == s.tree_nodes_kept <= 3 for s in steps + random_streams)
    assert [len(s.tokens) for s in steps[1:-1]] == [3] * (len(steps) - 2)
    assert set(rows) == {2}  # streams per node: the draft's depth, not gamma


def test_eos_inside_accepted_path_stops_exactly(tiny_models):
    loaded = tiny_models["llama"]
    prompt = encode_prompt(loaded, "eos inside the path")
    truth = ss.generate(loaded, prompt, max_tokens=12).token_ids
    eos = truth[6]
    loaded.eos_token_ids.add(eos)
    try:
        plain = ss.generate(loaded, prompt, max_tokens=12)
        params = streams_for(loaded, 6, gamma=4, top_k=1, n_msa_layers=2)

        def oracle(history):
            done = len(history) - len(prompt)
            return [[truth[done + j] if done + j < len(truth) else 0] for j in range(4)]

        chunks = list(
            ss.stream_generate(
                loaded, prompt, max_tokens=12, decoder="ss", streams=params, draft_override=oracle
            )
        )
    finally:
        loaded.eos_token_ids.discard(eos)
    assert [t for c in chunks for t in c.token_ids] == plain.token_ids == truth[: truth.index(eos)]
    assert chunks[-1].finish_reason == "stop"


def test_adapter_round_trip(tiny_models, tmp_path):
    loaded = tiny_models["qwen2"]
    params = streams_for(loaded, 7, gamma=2, n_msa_layers=2)
    folder = save_adapter(tmp_path / "adapter", params, loaded)
    again = load_adapter(folder, loaded)
    assert again.config == params.config
    for (name, a), (_, b) in zip(
        sorted(tree_flatten(params.parameters())),
        sorted(tree_flatten(again.parameters())),
        strict=True,
    ):
        assert mx.array_equal(a, b), name
    with pytest.raises(ss.SpecstreamError, match="exists"):
        save_adapter(folder, params, loaded)


def test_adapter_draft_vocabulary_round_trip_and_range(tiny_models, tmp_path):
    """A draft vocabulary travels with the adapter; one naming a token the model lacks is
    refused when the adapter is read, not at its first decode."""
    loaded = tiny_models["llama"]
    vocab = draft_vocab(loaded, 3)
    folder = save_adapter(
        tmp_path / "a", streams_for(loaded, 0, n_msa_layers=2, draft_vocab=vocab), loaded
    )
    assert load_adapter(folder, loaded).config.draft_vocab == vocab
    config = json.loads((folder / "adapter_config.json").read_text())
    config["stream_config"]["draft_vocab"] = [1, 2, loaded.config["vocab_size"]]
    (folder / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(ss.SpecstreamError, match="draft_vocab names token"):
        load_adapter(folder, loaded)


def test_draft_vocabulary_restricts_the_streams_to_its_tokens(tiny_models):
    """Stream logits over a draft vocabulary: the whole head's there, -inf elsewhere, so a
    token outside it is never drafted (and parent heads read a drafted token)."""
    loaded = tiny_models["qwen2"]
    arch = arch_of(loaded.model, loaded.config["model_type"])
    vocab = draft_vocab(loaded, 5)
    for parent in (0, 4):
        whole = streams_for(loaded, 2, gamma=3, n_msa_layers=2, parent_rank=parent)
        params = whole.with_config(draft_vocab=vocab)
        hidden = mx.random.normal((2, 3, loaded.config["hidden_size"]), key=mx.random.key(1))
        parents = mx.array([4, 9])
        got = tree_step.stream_logits(arch, params, hidden, parents)
        inside = mx.array(vocab)
        outside = np.setdiff1d(np.arange(loaded.config["vocab_size"]), vocab)
        assert np.isneginf(np.array(got[..., mx.array(outside)])).all()
        if not parent:  # each stream's logits alone: the whole head's on the vocabulary
            full = tree_step.stream_logits(arch, whole, hidden, parents)
            assert mx.allclose(got[..., inside], full[..., inside], atol=1e-4)
        else:  # stream 2 reads stream 1's best token within the vocabulary
            heads = params.parent_heads
            first = arch.lm_head(arch.norm(heads[0](hidden[:, 0], arch.embed(parents))))
            best = inside[mx.argmax(first[:, inside], axis=-1)]
            second = arch.lm_head(arch.norm(heads[1](hidden[:, 1], arch.embed(best))))
            assert mx.allclose(got[:, 1, inside], second[:, inside], atol=1e-4)


def test_a_generation_drafts_from_its_prompts_tokens_too(tiny_models, monkeypatch):
    """A generation's streams draft from their adapter's draft vocabulary and the prompt's own
    tokens (the last PROMPT_SLOTS new ones), always as many ids (one compiled trace), with the
    whole head's logits on them; every pass drafts over it, settled on the device or the host;
    where prompt lookup drafts (`ss+pld`), the adapter's vocabulary alone."""
    loaded = tiny_models["qwen2"]
    arch = arch_of(loaded.model, loaded.config["model_type"])
    vocab = draft_vocab(loaded, 5)
    params = streams_for(loaded, 2, gamma=3, n_msa_layers=2, draft_vocab=vocab)
    own = tree_step.DraftVocab.of(arch, params)
    prompt = [t for t in range(loaded.config["vocab_size"]) if t not in vocab][:40] + [vocab[0]]
    monkeypatch.setattr(policy, "PROMPT_SLOTS", 32)
    wide = own.with_prompt(arch, prompt)
    new = prompt[-33:-1]  # the last 32 new ones; the first 8 do not fit
    assert wide.ids.shape == (len(vocab) + 32,) and wide.columns.shape[1] == len(vocab) + 32
    assert set(wide.ids.tolist()) == set(vocab) | set(new)
    x = mx.random.normal((2, loaded.config["hidden_size"]), key=mx.random.key(4))
    got, whole = wide.logits(x), arch.lm_head(x)
    inside = mx.array(sorted(set(vocab) | set(new)))
    assert mx.allclose(got[:, inside], whole[:, inside], atol=1e-4).item()
    outside = np.setdiff1d(np.arange(loaded.config["vocab_size"]), np.array(inside))
    assert np.isneginf(np.array(got[:, mx.array(outside)])).all()
    short = own.with_prompt(arch, prompt[:3])  # fewer new tokens: padded to the same size
    assert short.ids.shape == wide.ids.shape
    assert set(short.ids.tolist()) == set(vocab) | set(prompt[:3])

    # every pass drafts over it: eager passes compute the streams' logits over these ids; a
    # compiled pass of a static tree settled on the device takes them as an input
    from specstream_mlx.decoding.passes import Passes

    drafted_over, logits, step = [], tree_step.DraftVocab.logits, Passes.step
    record = lambda ids: drafted_over.append(set(np.array(ids).tolist()))  # noqa: E731
    static = params.with_config(top_k=1, max_tree_nodes=3, tree=((0,), (0, 0)))
    for streams, decoder, compiled in (
        (params, "ss", False),  # a tree pruning may cut: passes settled on the host
        (static, "ss", False),  # a static tree: on the device, eager
        (static, "ss", True),  # on the device, compiled
        (static, "ss+pld", False),  # the lookup drafts the prompt: the adapter's vocabulary
    ):
        drafted_over.clear()
        with monkeypatch.context() as patch:
            if compiled:
                patch.setattr(Passes, "step", lambda self, shape, state, *a: (
                    record(state.vocab.ids) or step(self, shape, state, *a)))  # fmt: skip
            else:
                patch.setattr(tree_step.DraftVocab, "logits", lambda self, x: (
                    record(self.ids) or logits(self, x)))  # fmt: skip
            spec = ss.generate(loaded, prompt, max_tokens=12, decoder=decoder, streams=streams,
                               tree="adapter", compile=compiled, chat=False)  # fmt: skip
        assert spec.token_ids == ss.generate(loaded, prompt, max_tokens=12).token_ids
        wanted = set(vocab) if decoder == "ss+pld" else set(vocab) | set(new)
        assert drafted_over and all(ids == wanted for ids in drafted_over), decoder


def test_adapter_for_another_base_is_refused(tiny_models, tmp_path):
    qwen2 = tiny_models["qwen2"]
    folder = save_adapter(tmp_path / "a", streams_for(qwen2, 0, n_msa_layers=2), qwen2)
    with pytest.raises(ss.SpecstreamError, match="another base model.*model_type"):
        load_adapter(folder, tiny_models["llama"])


def test_adapter_with_wrong_shapes_lists_every_problem(tiny_models, tmp_path):
    loaded = tiny_models["llama"]
    folder = save_adapter(tmp_path / "a", streams_for(loaded, 0, gamma=2, n_msa_layers=2), loaded)
    config = json.loads((folder / "adapter_config.json").read_text())
    config["stream_config"]["gamma"] = 3
    config["stream_config"]["stream_adapter_rank"] = 4
    (folder / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(ss.SpecstreamError) as err:
        load_adapter(folder, loaded)
    message = str(err.value)
    assert "stream_embeddings: shape [2, 64], expected [3, 64]" in message
    assert "adapters.0.a: shape [64, 8], expected [64, 4]" in message


@pytest.mark.parametrize(
    "config, fragment",
    [
        (dict(gamma=0), "gamma must be in"),
        (dict(top_k=0), "top_k must be in"),
        (dict(n_msa_layers=4), "n_msa_layers must be in [1, 3]"),
        (dict(mode="fast"), "mode must be one of"),
        (dict(gamma=99, top_k=-1), "gamma must be in [1, 16], got 99; top_k"),
        (
            dict(mode="shared", shared_stream_adapters=False, attention_adapters=True),
            "attention_adapters needs the streams' own adapters",
        ),
        (dict(attention_adapters="yes"), "attention_adapters must be true or false"),
        (dict(parent_rank=-1), "parent_rank must be a whole number >= 0"),
        (dict(draft_vocab=(7, 3, 5)), "draft_vocab must be at least top_k (3) increasing"),
        (dict(draft_vocab=(1, 2)), "draft_vocab must be at least top_k (3) increasing"),
        (dict(draft_vocab=(-1, 2, 3)), "draft_vocab must be at least top_k (3) increasing"),
        (dict(gamma="four", lora_scale=None), "gamma must be a whole number, got 'four'; lora_"),
        (dict(top_k=2.0), "top_k must be a whole number, got 2.0"),
    ],
)
def test_bad_stream_config(tiny_models, config, fragment):
    with pytest.raises(ss.SpecstreamError, match=re.escape(fragment)):
        StreamConfig(**{"n_msa_layers": 2, **config}).validate(n_layers=4)


def test_top_k_tokens_best_first():
    from specstream_mlx.decoding.passes import top_k_ids

    def top_k_tokens(logits, k):
        return top_k_ids(logits, k).tolist()

    logits = mx.array([[0.1, 5.0, -1.0, 3.0, 4.0], [9.0, 0.0, 1.0, 2.0, 8.0]])
    assert top_k_tokens(logits, 3) == [[1, 4, 3], [0, 4, 3]]
    assert top_k_tokens(logits, 1) == [[1], [0]]


@pytest.mark.parametrize("vocab", [49152, 1280, 1000])
def test_top_k_over_blocks_equals_a_full_sort(vocab):
    """Large vocabularies go through the blocks' maxima: the same ids, best first, as sorting
    every column, also where the k best share a block or sit in the last one."""
    from specstream_mlx.decoding.passes import top_k_ids

    rng = np.random.default_rng(vocab)
    logits = rng.normal(size=(3, 2, vocab)).astype(np.float32)
    logits[0, 0, 130:134] = [9.0, 8.0, 7.0, 6.0]  # the 4 best in one block of 128
    logits[1, 1, -3:] = [7.0, 9.0, 8.0]  # the best in the last block
    for k in (2, 3, 5):
        expected = np.argsort(-logits, axis=-1, kind="stable")[..., :k]
        assert top_k_ids(mx.array(logits), k).tolist() == expected.tolist()


@pytest.mark.parametrize("shared", [False, True])
def test_msa_mask_semantics(shared):
    from specstream_mlx.decoding.tree_step import _msa_mask

    # Survivors: root 0, its child 1, and 2 (a second child of the root); 2 streams each.
    anc = draft_tree(5, [[6, 7]]).ancestors()
    prefix, gamma = 3, 2
    mask = np.array(_msa_mask(anc, prefix, gamma, shared))
    assert mask.shape == (3 + 3 * gamma, prefix + 3 + 3 * gamma)
    main_cols = slice(prefix, prefix + 3)
    stream_col = lambda node, j: prefix + 3 + node * gamma + j  # noqa: E731
    # Main rows: prefix + ancestors; streams only in shared mode, and only their own node's.
    assert mask[:3, :prefix].all()
    assert (mask[:3, main_cols] == anc).all()
    assert mask[1, stream_col(1, 0)] == mask[1, stream_col(1, 1)] == shared
    assert not mask[1, stream_col(0, 0)] and not mask[1, stream_col(2, 1)]
    # Stream j of node 1 sees prefix, nodes 0 and 1, its own streams 0..j, nothing else.
    row = 3 + 1 * gamma + 0
    assert mask[row, :prefix].all() and list(mask[row, main_cols]) == [True, True, False]
    assert mask[row, stream_col(1, 0)] and not mask[row, stream_col(1, 1)]
    assert mask[row + 1, stream_col(1, 1)] and mask[row + 1, stream_col(1, 0)]
    assert not mask[row, stream_col(0, 0)] and not mask[row, stream_col(2, 0)]


def test_unknown_adapter_name_lists_shipped(tiny_models):
    from specstream_mlx.streams.adapter_io import shipped_adapters

    with pytest.raises(ss.SpecstreamError, match="not a shipped adapter.*shipped: "):
        load_adapter("no-such-adapter", tiny_models["llama"])
    for name in shipped_adapters():  # shipped adapters are for the default model only
        with pytest.raises(ss.SpecstreamError, match="another base model"):
            load_adapter(name, tiny_models["llama"])


def test_pruned_tree_keeps_a_non_prefix_path_and_compacts_both_layer_groups(
    tiny_models, monkeypatch
):
    """Pruning keeps nodes 0, 2, 5 of a 7-node tree (not a prefix of the node order) and the
    truth lies on exactly that path: below the pruning point the caches hold all 7 nodes (rows
    0, 2, 5 move), above it only the 3 survivors. Every pass after the first accepts 3 tokens
    and the output stays exact."""
    loaded = tiny_models["llama"]
    vocab = loaded.config["vocab_size"]
    prompt = encode_prompt(loaded, "pruned compaction")
    saved = set(loaded.eos_token_ids)
    loaded.eos_token_ids.clear()
    try:
        truth = ss.generate(loaded, prompt, max_tokens=40).token_ids
        params = streams_for(loaded, 5, gamma=2, top_k=2, n_msa_layers=2, max_tree_nodes=3)

        def oracle(history):  # the truth at rank 1 of stream 1, rank 0 of stream 2
            done = len(history) - len(prompt)
            t0, t1 = truth[done], truth[done + 1]
            return [[(t0 + 1) % vocab, t0], [t1, (t1 + 1) % vocab]]

        def keep(tree, transition, threshold, cap):
            assert len(tree) == 7  # root, 2 children, 2 grandchildren each
            return [0, 2, 5]

        monkeypatch.setattr(tree_step, "prune_tree", keep)
        steps = []
        for step in run_steps(loaded, params, prompt, 30, oracle):
            steps.append(step)
    finally:
        loaded.eos_token_ids.update(saved)
    assert [t for s in steps for t in s.tokens] == truth[:30]
    assert [len(s.tokens) for s in steps[1:-1]] == [3] * (len(steps) - 2)
    assert all(s.tree_nodes == 7 and s.tree_nodes_kept == 3 for s in steps[1:])
