"""The next-token LoRA baseline (the paper's "Baseline" rows): the same LoRA layers as shared
mode trained on next-token loss alone, written as an mlx-lm adapter folder."""

import json
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.tuner.utils import load_adapters

import specstream_mlx as ss
from specstream_mlx.streams.adapter_io import attach, load_adapter
from specstream_mlx.streams.config import StreamConfig
from specstream_mlx.streams.params import StreamParams


def train_baseline(model_folder, data_file, out, steps=6):
    cmd = [
        sys.executable,
        "-m",
        "specstream_apps.cli",
        "train",
        "--mode",
        "next-token",
        "--model",
        str(model_folder),
        "--data",
        str(data_file),
        "--out",
        str(out),
        "--lora-rank",
        "4",
        "--lora-scale",
        "2",
        "--lora-lr",
        "1e-2",
        "--steps",
        str(steps),
        "--batch-size",
        "2",
        "--val-every",
        "3",
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def baseline(tiny_folders, tmp_path_factory):
    root = tmp_path_factory.mktemp("baseline")
    data_file = root / "train.jsonl"
    rows = [
        {"prompt": f"count from {i}", "completion": " ".join(str(i + k) for k in range(10))}
        for i in range(20)
    ]
    data_file.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    proc = train_baseline(tiny_folders["llama"], data_file, root / "lora")
    assert proc.returncode == 0, proc.stderr
    return root / "lora", data_file, proc


def test_baseline_trains_lora_only_and_lowers_the_loss(baseline, tiny_folders):
    folder, _, proc = baseline
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["fine_tune_type"] == "lora" and "stream_config" not in config
    assert config["lora_parameters"] == {"rank": 4, "scale": 2.0, "dropout": 0.0}
    history = [h["loss"] for h in config["training"]["loss_history"]]
    assert history[-1] < history[0]
    assert "next_token_accuracy" in config["training"]["validation"]
    assert "next-token NLL" in proc.stderr and not (folder.parent / "lora.checkpoint").exists()
    weights = mx.load(str(folder / "adapters.safetensors"))
    assert weights and all(k.endswith((".lora_a", ".lora_b")) for k in weights)
    assert any(np.abs(np.array(v)).max() > 0 for k, v in weights.items() if k.endswith("lora_b"))


def test_baseline_loads_here_and_in_mlx_lm_with_the_same_outputs(baseline, tiny_folders):
    folder = baseline[0]
    ours = ss.load(str(tiny_folders["llama"]), adapter=str(folder))
    assert ours.streams is None and ours.fused is not None  # fused into the float weights
    theirs = ss.load(str(tiny_folders["llama"]))
    plain = ss.generate(theirs, "count from 4", max_tokens=12).token_ids
    load_adapters(theirs.model, str(folder))  # mlx-lm's own reader
    ids = mx.array([[1, 5, 9, 13, 2, 7]])
    assert np.allclose(np.array(ours.model(ids)), np.array(theirs.model(ids)), atol=1e-5)
    tuned = ss.generate(ours, "count from 4", max_tokens=12).token_ids
    assert tuned == ss.generate(theirs, "count from 4", max_tokens=12).token_ids
    assert tuned != plain  # the LoRA layers change the model's output
    # lossless speculative decoding of the tuned model stays exact
    streams = StreamParams(StreamConfig(gamma=2, n_msa_layers=1), ours.config["hidden_size"])
    spec = ss.generate(
        ours, "count from 4", max_tokens=12, decoder="ss", streams=streams.randomize(0)
    )
    assert spec.token_ids == tuned


def test_baseline_never_changes_the_base_weights(baseline, tiny_folders):
    """Fused LoRA keeps the untouched base weights and puts them back, bit for bit."""
    fresh = ss.load(str(tiny_folders["llama"]))
    base = dict(tree_flatten(fresh.model.parameters()))
    tuned = ss.load(str(tiny_folders["llama"]), adapter=str(baseline[0]))
    fused = dict(tree_flatten(tuned.model.parameters()))
    kept = tuned.fused.base
    assert kept and all(
        np.array_equal(np.array(base[k + ".weight"]), np.array(w)) for k, w in kept.items()
    )
    assert not np.array_equal(
        np.array(fused[next(iter(kept)) + ".weight"]), np.array(next(iter(kept.values())))
    )
    attach(None, tuned)
    after = dict(tree_flatten(tuned.model.parameters()))
    assert after.keys() == base.keys()
    for name, value in base.items():
        assert np.array_equal(np.array(value), np.array(after[name])), name


def test_foreign_lora_folders_are_refused_before_the_model_changes(
    baseline, tiny_folders, tmp_path
):
    folder = baseline[0]
    loaded = ss.load(str(tiny_folders["llama"]), adapter=str(folder))
    before = {k: np.array(v) for k, v in tree_flatten(loaded.model.parameters())}
    config = json.loads((folder / "adapter_config.json").read_text())
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "adapters.safetensors").write_bytes((folder / "adapters.safetensors").read_bytes())
    (partial / "adapter_config.json").write_text(json.dumps({**config, "num_layers": 1}))
    with pytest.raises(ss.SpecstreamError, match="does not fit.*unexpected tensor"):
        load_adapter(partial, loaded)  # the file holds LoRA for a block num_layers leaves out
    (partial / "adapter_config.json").write_text(json.dumps({**config, "num_layers": 0}))
    with pytest.raises(ss.SpecstreamError, match="num_layers must be"):
        load_adapter(partial, loaded)
    wrong = {**config, "lora_parameters": {**config["lora_parameters"], "rank": 3}}
    (partial / "adapter_config.json").write_text(json.dumps(wrong))
    with pytest.raises(ss.SpecstreamError, match="does not fit.*expected"):
        load_adapter(partial, loaded)
    after = dict(tree_flatten(loaded.model.parameters()))  # the fused weights, unchanged
    assert set(after) == set(before)
    assert all(np.array_equal(before[k], np.array(after[k])) for k in before)


@pytest.mark.parametrize("fused", [True, False])  # unfused: as on a quantized base
def test_lora_folders_of_the_last_blocks_load_as_mlx_lm_reads_them(
    baseline, tiny_folders, tmp_path, monkeypatch, fused
):
    """mlx-lm trains LoRA in the last `num_layers` blocks (16 by default): such a folder loads,
    puts LoRA layers on those blocks alone when unfused, and computes what mlx-lm computes."""
    from mlx_lm.tuner.lora import LoRALinear

    from specstream_mlx.streams import adapter_io

    folder = baseline[0]
    config = json.loads((folder / "adapter_config.json").read_text())
    top = len(ss.load(str(tiny_folders["llama"])).model.model.layers) - 1
    weights = mx.load(str(folder / "adapters.safetensors"))
    partial = tmp_path / "last"
    partial.mkdir()
    mx.save_safetensors(
        str(partial / "adapters.safetensors"),
        {k: v for k, v in weights.items() if k.startswith(f"model.layers.{top}.")},
    )
    (partial / "adapter_config.json").write_text(json.dumps({**config, "num_layers": 1}))
    if not fused:
        monkeypatch.setattr(adapter_io, "can_fuse", lambda model, lora: False)
    ours = ss.load(str(tiny_folders["llama"]), adapter=str(partial))
    assert (ours.fused is not None) == fused
    wrapped = {
        i
        for i, layer in enumerate(ours.model.model.layers)
        if any(isinstance(m, LoRALinear) for _, m in layer.named_modules())
    }
    assert wrapped == (set() if fused else {top})
    theirs = ss.load(str(tiny_folders["llama"]))
    ids = mx.array([[1, 5, 9, 13, 2, 7]])
    base = np.array(theirs.model(ids))
    load_adapters(theirs.model, str(partial))  # mlx-lm's own reader
    assert np.allclose(np.array(ours.model(ids)), np.array(theirs.model(ids)), atol=1e-5)
    assert not np.allclose(np.array(ours.model(ids)), base, atol=1e-5)  # the LoRA is on


def test_baseline_training_needs_lora_and_resumes(tiny_folders, baseline, tmp_path):
    from specstream_mlx.streams.lora import apply_lora
    from specstream_mlx.training.data import load_dataset
    from specstream_mlx.training.trainer import Hooks, TrainConfig, train

    from .conftest import QUIET

    loaded = ss.load(str(tiny_folders["llama"]))
    data = load_dataset(baseline[1], loaded.tokenizer, 64)
    cfg = TrainConfig(steps=3, batch_size=1, val_every=9, checkpoint_every=1)
    with pytest.raises(ss.SpecstreamError, match="next-token baseline.*apply_lora"):
        train(loaded, None, data, data.examples[:1], tmp_path / "a", cfg, QUIET)
    apply_lora(loaded.model, rank=4, scale=2.0)
    train(
        loaded, None, data, data.examples[:1], tmp_path / "a", cfg, Hooks(stop_after=1, log=print)
    )
    progress = train(loaded, None, data, data.examples[:1], tmp_path / "a", cfg, Hooks(log=print))
    assert progress["step"] == 3 and len(progress["history"]) == 3
