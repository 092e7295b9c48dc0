"""AdapterManager: one resident base, adapters swapped per request, base weights never changed."""

import threading
from pathlib import Path

import numpy as np
import pytest
from mlx.utils import tree_flatten

import specstream_mlx as ss
from specstream_mlx.manager import AdapterManager
from specstream_mlx.streams.adapter_io import save_adapter
from specstream_mlx.streams.config import StreamConfig
from specstream_mlx.streams.lora import apply_lora, remove_lora
from specstream_mlx.streams.params import StreamParams

from .test_shared import randomize_lora, shared_streams

PROMPT = "swap adapters"


def base_weights(model) -> dict[str, np.ndarray]:
    """The base model's own weights (LoRA layers' wrapped originals included, LoRA excluded)."""
    return {
        k.replace(".linear.", "."): np.array(v)
        for k, v in tree_flatten(model.parameters())
        if not k.endswith((".lora_a", ".lora_b"))
    }


@pytest.fixture(scope="module")
def folders(tiny_folders, tmp_path_factory):
    """Shared adapters (a and c: the same rank, so a swap between them re-points the same LoRA
    layers; b another rank), a lossless one, and one for another base."""
    root = tmp_path_factory.mktemp("adapters")
    loaded = ss.load(str(tiny_folders["llama"]))
    out = {}
    for name, seed, rank in (("a", 1, 4), ("b", 2, 2), ("c", 5, 4)):
        params = shared_streams(loaded, seed, gamma=2, n_msa_layers=2, lora_rank=rank)
        apply_lora(loaded.model, rank=rank, scale=params.config.lora_scale)
        randomize_lora(loaded.model, seed=seed)
        out[name] = save_adapter(root / name, params, loaded)
        remove_lora(loaded.model)
    lossless = StreamParams(StreamConfig(gamma=2, n_msa_layers=2), 64).randomize(3)
    out["lossless"] = save_adapter(root / "lossless", lossless, loaded)
    other = ss.load(str(tiny_folders["qwen2"]))
    params = StreamParams(StreamConfig(gamma=2, n_msa_layers=2), 64).randomize(0)
    out["other"] = save_adapter(root / "other", params, other)
    return {k: str(v) for k, v in out.items()}


def alone(tiny_folders, adapter, decoder="ss"):
    """The tokens a fresh load of the base with `adapter` decodes: what a swap must give."""
    loaded = ss.load(str(tiny_folders["llama"]), adapter=adapter)
    decoder = decoder if adapter else "ar"
    return ss.generate(loaded, PROMPT, max_tokens=12, decoder=decoder).token_ids


def decode(manager, name, decoder="ss"):
    with manager.use(name) as loaded:
        decoder = decoder if name else "ar"
        return ss.generate(loaded, PROMPT, max_tokens=12, decoder=decoder).token_ids


@pytest.mark.parametrize("keep_fused", [True, False])
def test_swapping_changes_outputs_and_never_the_base(tiny_folders, folders, keep_fused):
    loaded = ss.load(str(tiny_folders["llama"]))
    before = base_weights(loaded.model)
    names = {k: folders[k] for k in ("a", "b", "c", "lossless")}
    manager = AdapterManager(loaded, names, keep_fused=keep_fused)
    assert manager.names() == ["a", "b", "c", "lossless"]
    want = {name: alone(tiny_folders, folder) for name, folder in names.items()}
    want[None] = alone(tiny_folders, None)
    assert want["a"] != want["c"] and want["a"] != want[None]  # the LoRA changes the model
    for name in ["a", "c", "a", "b", None, "lossless", "c", "a", "b", "a", None, "c"]:
        assert decode(manager, name) == want[name], name
    with manager.use("a") as session:  # a session of its own; the base object carries none
        assert session.adapter == names["a"] and session.streams is not None
        assert session.model is loaded.model and session.passes is loaded.passes
        assert loaded.streams is None and loaded.adapter is None
    with manager.use("lossless") as other:
        assert other.streams is not session.streams and loaded.streams is None
    manager.activate(None)  # shared LoRA is fused into the weights while on: the base comes back
    after = base_weights(loaded.model)
    assert before.keys() == after.keys()
    for key, value in before.items():
        np.testing.assert_array_equal(value, after[key], err_msg=key)
    assert manager.times.swaps and not manager.times.loads  # all resident since registration


def test_swaps_put_back_the_fused_weights_they_kept(tiny_folders, folders):
    """A resident adapter's fused weights are computed on its first activation and put back as
    they are at its next (keep_fused, the default), or computed again (keep_fused=False)."""
    names = {k: folders[k] for k in ("a", "c")}
    kept = AdapterManager(ss.load(str(tiny_folders["llama"])), names)
    lean = AdapterManager(ss.load(str(tiny_folders["llama"])), names, keep_fused=False)
    for manager in (kept, lean):
        manager.activate("a")
        first = manager.loaded.fused
        assert first is not None and first.weights
        manager.activate("c")
        manager.activate("a")
        again = manager.loaded.fused
        same = all(again.weights[p] is w for p, w in first.weights.items())
        assert same == (manager is kept), manager.keep_fused
    assert kept.resident()["a"] == lean.resident()["a"] + kept.loaded.fused.nbytes > 0
    kept.register("a", folders["c"])  # replaced: its kept weights go with it
    assert decode(kept, "a") == alone(tiny_folders, folders["c"])


def test_registering_a_name_again_replaces_it_even_while_active(tiny_folders, folders):
    manager = AdapterManager(ss.load(str(tiny_folders["llama"])), {"x": folders["a"]})
    assert decode(manager, "x") == alone(tiny_folders, folders["a"])
    manager.register("x", folders["c"])  # "x" is on the model right now
    assert decode(manager, "x") == alone(tiny_folders, folders["c"])
    manager.register("x", folders["a"], preload=False)
    assert decode(manager, "x") == alone(tiny_folders, folders["a"])


def test_an_adapter_for_another_base_is_refused(tiny_folders, folders):
    manager = AdapterManager(ss.load(str(tiny_folders["llama"])), {"a": folders["a"]})
    with pytest.raises(ss.SpecstreamError, match="made for another base model"):
        manager.register("other", folders["other"])
    assert manager.names() == ["a"]
    with pytest.raises(ss.SpecstreamError, match="unknown adapter 'other'; registered: a"):
        with manager.use("other"):
            pass


def test_least_recently_used_adapters_leave_memory_and_come_back(tiny_folders, folders):
    names = {k: folders[k] for k in ("a", "b", "lossless")}
    manager = AdapterManager(ss.load(str(tiny_folders["llama"])), names, max_resident=2)
    assert list(manager.resident()) == ["b", "lossless"]  # "a", read first, was dropped
    assert all(size > 0 for size in manager.resident().values())
    assert decode(manager, "a") == alone(tiny_folders, folders["a"])
    assert len(manager.times.loads) == 1  # read again from its folder
    assert list(manager.resident()) == ["lossless", "a"]
    decode(manager, "lossless")
    assert list(manager.resident()) == ["a", "lossless"] and len(manager.times.swaps) == 1


def test_concurrent_requests_each_get_their_adapter(tiny_folders, folders):
    names = {k: folders[k] for k in ("a", "b", "lossless")}
    manager = AdapterManager(ss.load(str(tiny_folders["llama"])), names)
    want = {name: decode(manager, name) for name in [*names, None]}
    order = ["a", "b", None, "lossless"] * 4
    got, errors = [None] * len(order), []

    def request(i):
        try:
            got[i] = decode(manager, order[i])
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=request, args=(i,)) for i in range(len(order))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert got == [want[name] for name in order]


def test_bad_names_and_limits(tiny_folders):
    loaded = ss.load(str(tiny_folders["llama"]))
    with pytest.raises(ss.SpecstreamError, match="max_resident must be >= 1"):
        AdapterManager(loaded, {}, max_resident=0)
    manager = AdapterManager(loaded, {})
    assert manager.names() == []  # no shipped adapter is made for this tiny model
    with pytest.raises(ss.SpecstreamError, match="not found"):
        manager.register("nope", "/no/such/folder")
    manager.register("later", "/no/such/folder", preload=False)  # checked on first use
    with pytest.raises(ss.SpecstreamError, match="not found"):
        manager.activate("later")


def test_shipped_adapters_are_found_for_their_model(tiny_folders, folders, tmp_path, monkeypatch):
    """Issue 19: the default model's adapters at the top of the package's adapters folder,
    another model's in a subfolder; a shipped name means the adapter made for the loaded model."""
    import shutil

    from specstream_mlx.streams import adapter_io

    shipped = tmp_path / "adapters"
    shutil.copytree(folders["lossless"], shipped / "chat")  # made for the llama model
    shutil.copytree(folders["other"], shipped / "tiny-qwen2" / "chat")  # for the qwen2 one
    monkeypatch.setattr(adapter_io, "SHIPPED_DIR", shipped)
    llama, qwen2 = (ss.load(str(tiny_folders[f])) for f in ("llama", "qwen2"))
    assert adapter_io.shipped_adapters() == ["chat"]  # the default model's
    assert adapter_io.resolve_adapter("chat", llama) == shipped / "chat"
    assert adapter_io.resolve_adapter("chat", qwen2) == shipped / "tiny-qwen2" / "chat"
    assert AdapterManager(qwen2).names() == ["chat"]
    manager = AdapterManager(llama)
    assert manager.names() == ["chat"] and manager.source("chat") == "shipped"
    manager.register("mine", str(folders["lossless"]))
    assert manager.source("mine") == str(Path(folders["lossless"]).resolve())
    with_streams = ss.load(str(tiny_folders["qwen2"]), adapter="chat")
    assert with_streams.streams is not None
    plain = ss.generate(with_streams, PROMPT, max_tokens=12).token_ids
    assert ss.generate(with_streams, PROMPT, max_tokens=12, decoder="ss").token_ids == plain
    mistral = ss.load(str(tiny_folders["mistral"]))
    assert adapter_io.shipped_adapters(mistral) == []
    with pytest.raises(ss.SpecstreamError, match="made for another base model"):
        ss.load(str(tiny_folders["mistral"]), adapter="chat")


@pytest.mark.slow
def test_default_model_registers_the_shipped_adapters(default_model):
    manager = AdapterManager(default_model)
    try:
        assert manager.names() == ["chat", "data2text", "sql", "summarize"]
        prompt = "Write the SQL query that answers the question for this table."
        with manager.use("sql") as loaded:
            got = ss.generate(loaded, prompt, max_tokens=8, decoder="ss").token_ids
        with manager.use("chat"):
            pass
        with manager.use("sql") as loaded:
            again = ss.generate(loaded, prompt, max_tokens=8, decoder="ss").token_ids
        assert got == again
    finally:
        manager.activate(None)
