"""Shared mode: LoRA in every layer, the main stream attends to its own streams. The decoder
stays exact against the shared model's own plain decoding, training and decoding compute the same
thing, and the base weights are never changed."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlx.utils import tree_flatten, tree_unflatten

import specstream_mlx as ss
from specstream_mlx.decoding.loop import Decoder, decode
from specstream_mlx.decoding.passes import Passes
from specstream_mlx.decoding.policy import TreePolicy
from specstream_mlx.decoding.tree import draft_tree
from specstream_mlx.models.arch import arch_of
from specstream_mlx.streams.adapter_io import load_adapter, save_adapter
from specstream_mlx.streams.config import StreamConfig
from specstream_mlx.streams.lora import apply_lora, has_lora, lora_block, lora_weights, remove_lora
from specstream_mlx.streams.params import StreamParams
from specstream_mlx.training import forward, positions
from specstream_mlx.training.data import load_dataset
from specstream_mlx.training.trainer import Hooks, TrainConfig, train

from .conftest import QUIET
from .tiny import FAMILIES, draft_vocab


@pytest.fixture(scope="module")
def shared_models(tiny_folders):
    """family -> (a tiny model with random LoRA layers on it, its base weights before)."""
    out = {}
    for family, folder in tiny_folders.items():
        loaded = ss.load(str(folder))
        base = {k: np.array(v) for k, v in tree_flatten(loaded.model.parameters())}
        apply_lora(loaded.model, rank=4, scale=2.0)
        randomize_lora(loaded.model, seed=len(out))
        out[family] = (loaded, base)
    return out


def randomize_lora(model, seed):
    keys = iter(mx.random.split(mx.random.key(seed), 10_000))
    new = [
        (k[len("lora.") :], mx.random.normal(v.shape, key=next(keys)) * 0.05)
        for k, v in lora_weights(model).items()
    ]
    model.update(tree_unflatten(new))


def shared_streams(loaded, seed=0, **config):
    cfg = StreamConfig(mode="shared", **config).validate(loaded.config["num_hidden_layers"])
    return StreamParams(cfg, loaded.config["hidden_size"]).randomize(seed)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    family=st.sampled_from(sorted(FAMILIES)),
    gamma=st.integers(1, 3),
    top_k=st.integers(1, 3),
    n_msa=st.integers(1, 3),
    cap=st.integers(1, 30),
    prompt=st.text(min_size=1, max_size=30).filter(str.strip),
    length=st.integers(1, 16),
    seed=st.integers(0, 1000),
    prompt_streams=st.booleans(),
    stream_adapters=st.booleans(),
    attn=st.booleans(),
    compiled=st.booleans(),
    parent=st.sampled_from([0, 4]),
    vocab=st.booleans(),
)
def test_shared_speculative_equals_its_plain_decoding(
    shared_models,
    family,
    gamma,
    top_k,
    n_msa,
    cap,
    prompt,
    length,
    seed,
    prompt_streams,
    stream_adapters,
    attn,
    compiled,
    parent,
    vocab,
):
    loaded, _ = shared_models[family]
    params = shared_streams(
        loaded,
        seed,
        gamma=gamma,
        top_k=top_k,
        n_msa_layers=n_msa,
        max_tree_nodes=cap,
        prompt_streams=prompt_streams,
        shared_stream_adapters=stream_adapters,
        attention_adapters=attn and stream_adapters,
        parent_rank=parent,
        draft_vocab=draft_vocab(loaded, seed) if vocab else None,
    )
    loaded.streams = params  # "ar" with a shared adapter: one token per pass, streams computed
    try:
        plain = ss.generate(loaded, prompt, max_tokens=length, compile=False)
        spec = ss.generate(
            loaded, prompt, max_tokens=length, decoder="ss", streams=params, compile=compiled
        )
    finally:
        loaded.streams = None
    assert plain.stats.forward_passes == plain.stats.accepted_tokens
    assert spec.token_ids == plain.token_ids
    assert spec.stats.forward_passes <= plain.stats.forward_passes


@pytest.mark.parametrize("prompt_streams", [False, True])
def test_shared_mode_changes_the_output_and_training_matches_decoding(
    shared_models, prompt_streams
):
    """The main stream attends to its streams, so shared-mode output differs from the LoRA model
    without streams; the training forward's main-stream argmax reproduces decoding, with streams
    from the last prompt token on (default) or on every token (adapters made before)."""
    loaded, _ = shared_models["llama"]
    params = shared_streams(loaded, 3, gamma=3, n_msa_layers=2, prompt_streams=prompt_streams)
    params.stream_embeddings = params.stream_embeddings * 50  # streams that matter
    prompt = [3, 40, 41, 42, 43, 44]
    loaded.streams = params
    try:
        decoded = ss.generate(loaded, prompt, max_tokens=12).token_ids
    finally:
        loaded.streams = None
    without = ss.generate(loaded, prompt, max_tokens=12).token_ids
    assert decoded != without
    arch = arch_of(loaded.model, "llama")
    ids = mx.array(prompt + decoded)
    mask = np.array([False] * len(prompt) + [True] * len(decoded))
    carry = positions.shared_stream_positions(params.config, mask)
    assert carry[0] == (0 if prompt_streams else len(prompt) - 1)
    _, main, _ = forward.shared_hidden(arch, params, forward.Frozen.of(arch, ids, 0), carry)
    argmax = np.array(mx.argmax(arch.lm_head(arch.norm(main)), axis=-1))
    assert list(argmax[len(prompt) - 1 : -1]) == decoded


def test_shared_training_trains_lora_and_streams_only(tiny_folders, tmp_path):
    loaded = ss.load(str(tiny_folders["llama"]))
    base = {k: np.array(v) for k, v in tree_flatten(loaded.model.parameters())}
    data_file = tmp_path / "d.jsonl"
    rows = [
        {"prompt": f"n {i}", "completion": " ".join(str(i + k) for k in range(8))} for i in range(8)
    ]
    data_file.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    data = load_dataset(data_file, loaded.tokenizer, 128)
    params = shared_streams(loaded, 0, gamma=2, n_msa_layers=2, lora_rank=4, lora_scale=2.0)
    before = {k: np.array(v) for k, v in tree_flatten(params.parameters())}
    apply_lora(loaded.model, rank=4, scale=2.0)
    cfg = TrainConfig(steps=8, batch_size=2, learning_rate=3e-3, val_every=8, checkpoint_every=4)
    progress = train(loaded, params, data, data.examples[:2], tmp_path / "a", cfg, QUIET)
    losses = [h["loss"] for h in progress["history"]]
    assert np.mean(losses[-2:]) < np.mean(losses[:2])
    after = dict(tree_flatten(loaded.model.parameters()))
    for name, value in base.items():  # base weights sit under .linear. in LoRA layers
        moved = name.replace("_proj.", "_proj.linear.")
        key = moved if moved in after else name
        assert np.array_equal(value, np.array(after[key])), name
    trained_b = [v for k, v in lora_weights(loaded.model).items() if k.endswith("lora_b")]
    assert all(np.abs(np.array(v)).max() > 0 for v in trained_b)
    streams_after = dict(tree_flatten(params.parameters()))
    assert any(k.startswith("adapters.") for k in before)  # the streams' own adapters train too
    for name, value in before.items():
        assert not np.array_equal(value, np.array(streams_after[name])), name
    folder = save_adapter(tmp_path / "shared", params, loaded)
    fresh = ss.load(str(tiny_folders["llama"]), adapter=str(folder))
    assert fresh.fused is not None and fresh.streams.config.mode == "shared"  # LoRA fused
    prompt = "n 3"
    want = ss.generate(loaded_with(loaded, params), prompt, max_tokens=10).token_ids
    assert ss.generate(fresh, prompt, max_tokens=10).token_ids == want
    assert ss.generate(fresh, prompt, max_tokens=10, decoder="ss").token_ids == want
    remove_lora(fresh.model)
    assert not has_lora(fresh.model)


def loaded_with(loaded, params):
    loaded.streams = params
    return loaded


def test_refused_adapter_leaves_the_model_as_it_was(tiny_folders, tmp_path):
    """A folder whose config claims shared mode but misses the LoRA tensors is refused with every
    problem listed, and a shared adapter already on the model stays there, unchanged."""
    loaded = ss.load(str(tiny_folders["llama"]))
    good = shared_streams(loaded, 1, gamma=2, n_msa_layers=2, lora_rank=4, lora_scale=2.0)
    apply_lora(loaded.model, rank=4, scale=2.0)
    randomize_lora(loaded.model, seed=7)
    good_folder = save_adapter(tmp_path / "good", good, loaded)
    remove_lora(loaded.model)
    lossless = StreamParams(StreamConfig(gamma=2, n_msa_layers=2), loaded.config["hidden_size"])
    bad_folder = save_adapter(tmp_path / "bad", lossless, loaded)
    config = json.loads((bad_folder / "adapter_config.json").read_text())
    config["stream_config"].update(mode="shared", shared_stream_adapters=False)
    (bad_folder / "adapter_config.json").write_text(json.dumps(config))

    fresh = ss.load(str(tiny_folders["llama"]), adapter=str(good_folder))
    before = {k: np.array(v) for k, v in lora_weights(fresh.model).items()}
    with pytest.raises(ss.SpecstreamError, match="missing tensor lora.*unexpected tensor adapters"):
        load_adapter(bad_folder, fresh)
    after = lora_weights(fresh.model)
    assert set(after) == set(before)
    assert all(np.array_equal(before[k], np.array(after[k])) for k in before)
    config["stream_config"]["gamma"] = "two"
    (bad_folder / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(ss.SpecstreamError, match="unreadable .*gamma must be a whole number"):
        load_adapter(bad_folder, fresh)


def test_training_refuses_mismatched_lora_and_resume_with_other_streams(tiny_folders, tmp_path):
    loaded = ss.load(str(tiny_folders["llama"]))
    data_file = tmp_path / "d.jsonl"
    data_file.write_text('{"prompt": "a", "completion": "b c d e f g h"}\n' * 3)
    data = load_dataset(data_file, loaded.tokenizer, 64)
    cfg = TrainConfig(steps=2, batch_size=1, val_every=9, checkpoint_every=1)
    params = shared_streams(loaded, 0, gamma=2, n_msa_layers=2)  # lora_rank 8, scale 20
    with pytest.raises(ss.SpecstreamError, match="shared mode trains LoRA layers"):
        train(loaded, params, data, data.examples[:1], tmp_path / "a", cfg, QUIET)
    lossless = StreamParams(StreamConfig(gamma=2, n_msa_layers=2), loaded.config["hidden_size"])
    train(
        loaded,
        lossless,
        data,
        data.examples[:1],
        tmp_path / "b",
        cfg,
        Hooks(stop_after=1, log=lambda s: None),
    )
    other = StreamParams(StreamConfig(gamma=3, n_msa_layers=2), loaded.config["hidden_size"])
    with pytest.raises(ss.SpecstreamError, match="other settings \\(gamma: 2 -> 3\\)"):
        train(loaded, other, data, data.examples[:1], tmp_path / "b", cfg, QUIET)
    apply_lora(loaded.model, rank=8, scale=20.0)
    with pytest.raises(ss.SpecstreamError, match="without LoRA"):
        train(loaded, lossless, data, data.examples[:1], tmp_path / "c", cfg, QUIET)


def test_adapters_saved_before_prompt_streams_keep_running_them():
    old = StreamConfig(mode="shared").to_dict()
    del old["prompt_streams"], old["shared_stream_adapters"], old["main_reads_streams"]
    assert StreamConfig.from_dict(old).prompt_streams is True  # and the main reads them
    assert StreamConfig.from_dict(old).has_stream_adapters is False
    new = StreamConfig.from_dict(StreamConfig(mode="shared").to_dict())
    assert new.prompt_streams is False and new.has_stream_adapters is True
    with pytest.raises(ss.SpecstreamError, match="prompt_streams"):
        StreamConfig(prompt_streams="yes").validate()


def test_compiled_passes_follow_swapped_lora_weights(shared_models):
    """A compiled trace holds the weights it saw: new LoRA tensors on the same layers (another
    adapter of the same rank) must be traced anew, not decoded with the old ones."""
    loaded, _ = shared_models["llama"]
    params = shared_streams(loaded, 3, gamma=2, n_msa_layers=2, top_k=2, max_tree_nodes=4)
    saved = lora_weights(loaded.model)
    try:
        outputs = []
        for seed in (101, 102):
            randomize_lora(loaded.model, seed)
            runs = [
                ss.generate(
                    loaded, "swap", max_tokens=16, decoder="ss", streams=params, compile=c
                ).token_ids
                for c in (False, True)
            ]
            assert runs[0] == runs[1]
            outputs.append(runs[0])
        assert outputs[0] != outputs[1]  # the swap changed the model
    finally:
        loaded.model.update(tree_unflatten([(k[len("lora.") :], v) for k, v in saved.items()]))


def test_a_pass_heads_only_the_streams_it_drafts_from(shared_models):
    """A tree of depth 2 over 3 shared streams: the head reads streams 1-2 (3 when probed),
    and every pass after the first still verifies the whole tree drafted from them."""
    loaded, _ = shared_models["llama"]
    params = shared_streams(loaded, 3, gamma=3, n_msa_layers=2)
    arch = arch_of(loaded.model, loaded.config["model_type"])
    policy = TreePolicy.static(((0,), (1,), (0, 0)))
    prompt = [5, 9, 2, 7, 11, 3]
    loaded.streams = params
    try:
        plain = ss.generate(loaded, prompt, max_tokens=12, compile=False).token_ids
    finally:
        loaded.streams = None

    def no_match(history, _hidden):  # a drafter that never proposes: the streams draft
        return draft_tree(history[-1], [])

    assert Decoder(loaded.model, arch, params, policy, probe=[]).drafted == 3
    for compiled in (True, False):
        passes = Passes(arch, params, compiled)
        on_host = Decoder(loaded.model, arch, params, policy, no_match, passes)
        assert on_host.drafted == 2
        steps = list(decode(on_host, prompt, 12))
        assert [t for s in steps for t in s.tokens] == plain
        assert {s.tree_nodes for s in steps[1:]} == {4}
        on_device = Decoder(loaded.model, arch, params, policy, passes=passes)
        assert [t for s in decode(on_device, prompt, 12) for t in s.tokens] == plain


@pytest.mark.parametrize("fused", [True, False])  # unfused: as on a quantized base
def test_lora_of_the_top_blocks_alone_is_stored_alone_and_decodes_the_same(
    tiny_folders, tmp_path, monkeypatch, fused
):
    """An adapter whose LoRA trained in its top blocks only (train --lora-layers) stores those
    blocks alone, named in lora_blocks, and decodes exactly as the same adapter stored whole."""
    from mlx.utils import tree_unflatten as unflatten
    from safetensors.numpy import load_file, save_file

    from specstream_mlx.streams import adapter_io
    from specstream_mlx.streams.lora import expected_lora_shapes

    loaded = ss.load(str(tiny_folders["llama"]))
    top = loaded.config["num_hidden_layers"] - 1
    params = shared_streams(loaded, 1, gamma=2, n_msa_layers=1, lora_rank=4, lora_scale=2.0)
    apply_lora(loaded.model, rank=4, scale=2.0)
    randomize_lora(loaded.model, seed=3)
    noisy = save_adapter(tmp_path / "noisy", params, loaded)  # LoRA in every block
    below = [  # zero LoRA below the top block, as training with lora_layers=1 leaves it
        (k[len("lora.") :], mx.zeros(v.shape))
        for k, v in lora_weights(loaded.model).items()
        if f".layers.{top}." not in k
    ]
    loaded.model.update(unflatten(below))
    sparse = save_adapter(tmp_path / "sparse", params, loaded)
    config = json.loads((sparse / "adapter_config.json").read_text())
    assert config["stream_config"]["lora_blocks"] == [top]
    stored = [k for k in config["shapes"] if k.startswith("lora.")]
    assert stored and all(f".layers.{top}." in k for k in stored)

    whole = tmp_path / "whole"  # the same adapter in the format that stores every block
    whole.mkdir()
    tensors = load_file(str(sparse / "adapters.safetensors"))
    for k, shape in expected_lora_shapes(loaded.model, 4).items():
        tensors.setdefault(k, np.zeros(shape, np.float32))
    save_file(tensors, str(whole / "adapters.safetensors"))
    config["stream_config"]["lora_blocks"] = None
    config["shapes"] = {k: list(v.shape) for k, v in tensors.items()}
    (whole / "adapter_config.json").write_text(json.dumps(config))
    size = (sparse / "adapters.safetensors").stat().st_size
    assert size < (whole / "adapters.safetensors").stat().st_size

    if not fused:
        monkeypatch.setattr(adapter_io, "can_fuse", lambda model, lora: False)
    runs = []
    for folder in (sparse, whole):
        fresh = ss.load(str(tiny_folders["llama"]))
        load_adapter(noisy, fresh)  # swapped out: its LoRA must not stay in the blocks below
        streams = load_adapter(folder, fresh)
        assert (fresh.fused is not None) == fused
        layers = fresh.model.model.layers
        wrapped = {i for i, layer in enumerate(layers) if has_lora(layer)}
        every = set(range(len(layers)))
        assert wrapped == (set() if fused else {top} if folder == sparse else every)
        out = ss.generate(fresh, "a b c a b c", max_tokens=12, decoder="ss", streams=streams)
        runs.append(out.token_ids)
    assert runs[0] == runs[1] and len(runs[0]) == 12


def test_next_token_lora_of_the_top_blocks_is_stored_as_mlx_lm_reads_it(tiny_folders, tmp_path):
    """The next-token baseline trained in its top blocks only (train --lora-layers) stores those
    blocks alone, as mlx-lm's num_layers; ss.load and mlx-lm's own loader give its logits."""
    from mlx_lm import load as mlx_lm_load

    from specstream_mlx.streams.adapter_io import save_lora_adapter

    loaded = ss.load(str(tiny_folders["llama"]))
    n_layers = loaded.config["num_hidden_layers"]
    apply_lora(loaded.model, rank=4, scale=2.0)
    randomize_lora(loaded.model, seed=4)
    below = [  # zero LoRA below the top two blocks, as training with lora_layers=2 leaves it
        (k[len("lora.") :], mx.zeros(v.shape))
        for k, v in lora_weights(loaded.model).items()
        if lora_block(k) < n_layers - 2
    ]
    loaded.model.update(tree_unflatten(below))
    folder = save_lora_adapter(tmp_path / "top2", loaded)
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["num_layers"] == 2
    stored = mx.load(str(folder / "adapters.safetensors"))
    blocks = {lora_block(k) for k in stored}
    assert blocks == {n_layers - 2, n_layers - 1}

    ids = mx.array([[5, 9, 2, 7, 3]])
    want = loaded.model(ids)
    ours = ss.load(str(tiny_folders["llama"]), adapter=str(folder)).model  # fused: rounding
    assert mx.allclose(ours(ids), want, atol=1e-5)
    theirs, _ = mlx_lm_load(str(tiny_folders["llama"]), adapter_path=str(folder))
    assert mx.allclose(theirs(ids), want, atol=1e-5)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    family=st.sampled_from(sorted(FAMILIES)),
    gamma=st.integers(1, 3),
    n_msa=st.integers(1, 3),
    prompt=st.text(min_size=1, max_size=30).filter(str.strip),
    length=st.integers(1, 16),
    seed=st.integers(0, 1000),
    compiled=st.booleans(),
    parent=st.sampled_from([0, 4]),
)
def test_a_main_stream_that_ignores_its_streams_decodes_the_lora_model_exactly(
    shared_models, family, gamma, n_msa, prompt, length, seed, compiled, parent
):
    """main_reads_streams false: whatever the streams hold (here strong enough to move a main
    stream that read them), `ss` and `ar` give the tokens of the model with its LoRA alone."""
    loaded, _ = shared_models[family]
    params = shared_streams(
        loaded, seed, gamma=gamma, n_msa_layers=n_msa, main_reads_streams=False, parent_rank=parent
    )
    params.stream_embeddings = params.stream_embeddings * 50
    lora_alone = ss.generate(loaded, prompt, max_tokens=length, compile=False)
    loaded.streams = params
    try:
        plain = ss.generate(loaded, prompt, max_tokens=length, compile=compiled)
        spec = ss.generate(
            loaded, prompt, max_tokens=length, decoder="ss", streams=params, compile=compiled
        )
    finally:
        loaded.streams = None
    assert plain.token_ids == spec.token_ids == lora_alone.token_ids
    assert spec.stats.forward_passes <= plain.stats.forward_passes


def test_training_a_main_stream_that_ignores_its_streams_matches_decoding(shared_models):
    """The training forward's mask is decoding's: with main_reads_streams false its main-stream
    argmax is the LoRA model's greedy decoding, streams that matter or not; and a config cannot
    ask the prompt's tokens to carry streams that nothing reads."""
    loaded, _ = shared_models["llama"]
    params = shared_streams(loaded, 3, gamma=3, n_msa_layers=2, main_reads_streams=False)
    params.stream_embeddings = params.stream_embeddings * 50
    prompt = [3, 40, 41, 42, 43, 44]
    decoded = ss.generate(loaded, prompt, max_tokens=12).token_ids
    arch = arch_of(loaded.model, "llama")
    ids = mx.array(prompt + decoded)
    mask = np.array([False] * len(prompt) + [True] * len(decoded))
    carry = positions.shared_stream_positions(params.config, mask)
    _, main, _ = forward.shared_hidden(arch, params, forward.Frozen.of(arch, ids, 0), carry)
    argmax = np.array(mx.argmax(arch.lm_head(arch.norm(main)), axis=-1))
    assert list(argmax[len(prompt) - 1 : -1]) == decoded
    with pytest.raises(ss.SpecstreamError, match="prompt_streams needs"):
        StreamConfig(mode="shared", main_reads_streams=False, prompt_streams=True).validate()
    with pytest.raises(ss.SpecstreamError, match="main_reads_streams must be true or false"):
        StreamConfig(mode="shared", main_reads_streams="no").validate()


def test_a_shared_adapter_becomes_one_whose_main_stream_ignores_its_streams(tiny_folders, tmp_path):
    """main_ignoring_streams: the same files but the config, whose main stream no longer reads
    the streams: plain decoding and `ss` then give the model-with-its-LoRA-alone's tokens (not
    the shared adapter's, which its streams moved); anything else is refused."""
    from specstream_mlx.streams.adapter_io import main_ignoring_streams
    from specstream_mlx.streams.fingerprint import weights_sha256

    folder = str(tiny_folders["llama"])
    trained = ss.load(folder)
    apply_lora(trained.model, rank=4, scale=2.0)
    randomize_lora(trained.model, seed=3)
    params = shared_streams(trained, 5, gamma=2, n_msa_layers=2, lora_rank=4, lora_scale=2.0)
    params.stream_embeddings = params.stream_embeddings * 50  # the main stream reads them
    shared = save_adapter(tmp_path / "shared", params, trained, {"training": {"data": "rows"}})
    (shared / "README.md").write_text("licences\n")
    prompt = [3, 40, 41, 42, 43, 44]
    lora_alone = ss.generate(trained, prompt, max_tokens=16).token_ids  # no streams on it

    out = main_ignoring_streams(shared, tmp_path / "ignores", ss.load(folder))
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["stream_config"]["main_reads_streams"] is False
    assert config["stream_config"]["prompt_streams"] is False
    assert config["main_ignores_streams_of"]["sha256"] == weights_sha256(shared)
    assert config["training"] == {"data": "rows"}
    for name in ("adapters.safetensors", "README.md"):
        assert (out / name).read_bytes() == (shared / name).read_bytes()
    user, before = ss.load(folder, adapter=str(out)), ss.load(folder, adapter=str(shared))
    plain = ss.generate(user, prompt, max_tokens=16)
    spec = ss.generate(user, prompt, max_tokens=16, decoder="ss", streams=user.streams)
    assert plain.token_ids == spec.token_ids == lora_alone
    assert ss.generate(before, prompt, max_tokens=16).token_ids != lora_alone
    for bad in (
        out,
        save_adapter(
            tmp_path / "lossless",
            StreamParams(StreamConfig(gamma=2, n_msa_layers=2), trained.config["hidden_size"]),
            trained,
        ),
    ):
        with pytest.raises(ss.SpecstreamError, match="not a shared-mode adapter whose main"):
            main_ignoring_streams(bad, tmp_path / "bad", ss.load(folder))
    assert not (tmp_path / "bad").exists()


def test_a_lora_and_the_lossless_streams_of_its_merged_model_pack_into_one_adapter(
    tiny_folders, tmp_path
):
    """pack_lora_streams: a next-token LoRA folder and lossless streams trained over that LoRA
    merged into the base make one adapter for the untouched base, which decodes exactly the
    LoRA's tokens and drafts exactly as the streams did on the merged model (the same passes);
    it records both folders' training and keeps the streams' acceptance statistics."""
    from specstream_mlx.calibration import measure_acceptance
    from specstream_mlx.streams.acceptance import Acceptance
    from specstream_mlx.streams.adapter_io import pack_lora_streams, save_lora_adapter
    from specstream_mlx.streams.fingerprint import MERGED_LORA

    folder = str(tiny_folders["llama"])
    base = ss.load(folder)
    apply_lora(base.model, rank=4, scale=2.0)
    randomize_lora(base.model, seed=5)
    lora = save_lora_adapter(tmp_path / "lora", base, extra={"training": {"data": "rows A"}})
    merged = ss.load(folder, adapter=str(lora))  # the LoRA fused into the weights
    cfg = StreamConfig(gamma=2, n_msa_layers=2, parent_rank=4)
    params = StreamParams(cfg, merged.config["hidden_size"]).randomize(7)
    params.stream_embeddings = params.stream_embeddings * 50  # would move a main that read them
    params.acceptance = Acceptance.from_ranks([[0, 0]] * 40 + [[1, 0]] * 10, 2, "a test")
    lossless = save_adapter(tmp_path / "streams", params, merged, {"training": {"data": "rows B"}})

    out = pack_lora_streams(lora, lossless, tmp_path / "packed", ss.load(folder))
    config = json.loads((out / "adapter_config.json").read_text())
    stored = config["stream_config"]
    assert (stored["mode"], stored["main_reads_streams"], stored["lora_rank"]) == (
        "shared",
        False,
        4,
    )
    assert config["training"]["lora"]["training"] == {"data": "rows A"}
    assert config["training"]["streams"]["training"] == {"data": "rows B"}
    assert (out / "acceptance.json").read_text() == (lossless / "acceptance.json").read_text()

    user = ss.load(folder, adapter=str(out))
    prompt = [3, 40, 41, 42, 43, 44]
    packed = ss.generate(user, prompt, max_tokens=16, decoder="ss", tree="adapter")
    lora_alone = ss.generate(merged, prompt, max_tokens=16)
    assert packed.token_ids == lora_alone.token_ids and packed.decoder == "ss"
    probed = [
        measure_acceptance(m, p, [prompt], 16) for m, p in ((user, user.streams), (merged, params))
    ]
    assert probed[0].to_dict() == probed[1].to_dict()  # the same ranks, the same confidences
    with pytest.raises(ss.SpecstreamError, match="not a next-token LoRA folder"):
        pack_lora_streams(lossless, lossless, tmp_path / "bad", ss.load(folder))
    other = tmp_path / "merged_other"  # a merged model folder of another LoRA, as its config says
    shutil.copytree(folder, other)
    config = json.loads((other / "config.json").read_text())
    config[MERGED_LORA] = {"adapter": "elsewhere", "sha256": "0" * 64}
    (other / "config.json").write_text(json.dumps(config))
    trained_there = save_adapter(tmp_path / "streams_other", params, ss.load(str(other)))
    with pytest.raises(ss.SpecstreamError, match="the merge of another LoRA"):
        pack_lora_streams(lora, trained_there, tmp_path / "bad", ss.load(folder))
    shutil.rmtree(other)  # the streams' own record still tells
    with pytest.raises(ss.SpecstreamError, match="the merge of another LoRA"):
        pack_lora_streams(lora, trained_there, tmp_path / "bad", ss.load(folder))
    with pytest.raises(ss.SpecstreamError, match="not a lossless stream adapter"):
        pack_lora_streams(lora, out, tmp_path / "bad", ss.load(folder))
    script = Path(__file__).resolve().parent.parent / "scripts" / "pack_lora_streams.py"
    proc = subprocess.run(
        [sys.executable, str(script), str(lossless), str(lossless), str(tmp_path / "bad"),
         "--model", folder],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("pack_lora_streams: ") and "not a next-token" in proc.stderr
    assert not (tmp_path / "bad").exists()
