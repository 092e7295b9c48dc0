"""Medusa-1 heads, the comparator: training on the frozen base, folders, and drafts verified by
the tree step so that greedy output equals plain decoding on every family."""

import json

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlx.utils import tree_flatten

import specstream_mlx as ss
from specstream_mlx.baselines.medusa import (
    MedusaConfig,
    MedusaDrafter,
    load_medusa,
    new_heads,
    save_medusa,
)
from specstream_mlx.bench.run import BenchConfig, run_bench
from specstream_mlx.models.arch import arch_of
from specstream_mlx.training.data import Example, load_dataset
from specstream_mlx.training.medusa_loss import head_targets
from specstream_mlx.training.trainer import TrainConfig, train

from .tiny import FAMILIES


@pytest.fixture(scope="module")
def tiny_models(tiny_folders):
    return {family: ss.load(str(folder)) for family, folder in tiny_folders.items()}


def random_heads(loaded, seed, **config):
    arch = arch_of(loaded.model, loaded.config["model_type"])
    heads = new_heads(loaded, arch, MedusaConfig(**config))
    keys = iter(mx.random.split(mx.random.key(seed), 100))
    for block in heads.blocks:  # blocks that move the hidden state: drafts differ per head
        block.linear.weight = mx.random.normal(block.linear.weight.shape, key=next(keys)) * 0.3
    return heads


def test_head_targets_by_hand():
    ex = Example(ids=[10, 11, 12, 13, 14], loss_mask=[False, False, True, True, True])
    # head k at position p predicts token p + 1 + k, kept when that token is a target
    assert head_targets(ex, 2) == [(0, 1, 12), (1, 1, 13), (2, 1, 14), (0, 2, 13), (1, 2, 14)]
    ex.loss_mask[2] = False  # token 2 is no target any more
    assert head_targets(ex, 2) == [(1, 1, 13), (2, 1, 14), (0, 2, 13), (1, 2, 14)]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    family=st.sampled_from(sorted(FAMILIES)),
    n_heads=st.integers(1, 4),
    top_k=st.integers(1, 3),
    cap=st.integers(1, 12),
    prompt=st.text(min_size=1, max_size=30).filter(str.strip),
    length=st.integers(1, 20),
    seed=st.integers(0, 1000),
)
def test_medusa_equals_plain_greedy(tiny_models, family, n_heads, top_k, cap, prompt, length, seed):
    loaded = tiny_models[family]
    heads = random_heads(loaded, seed, n_heads=n_heads, top_k=top_k, max_tree_nodes=cap)
    plain = ss.generate(loaded, prompt, max_tokens=length)
    chunks = list(
        ss.stream_generate(
            loaded, prompt, max_tokens=length, decoder="pld", drafter=MedusaDrafter(heads)
        )
    )
    assert [t for c in chunks for t in c.token_ids] == plain.token_ids
    assert chunks[-1].stats.tree_nodes <= chunks[-1].stats.forward_passes * cap


def test_training_lowers_the_loss_keeps_the_base_and_round_trips(tiny_folders, tmp_path):
    loaded = ss.load(str(tiny_folders["llama"]))
    base = {k: np.array(v) for k, v in tree_flatten(loaded.model.parameters())}
    rows = [
        {"prompt": f"n {i}", "completion": " ".join(str(i + k) for k in range(10))}
        for i in range(8)
    ]
    data_file = tmp_path / "d.jsonl"
    data_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = load_dataset(data_file, loaded.tokenizer, 128)
    arch = arch_of(loaded.model, "llama")
    heads = new_heads(loaded, arch, MedusaConfig(n_heads=2))
    cfg = TrainConfig(steps=12, batch_size=2, learning_rate=3e-3, val_every=6, segment=0)
    progress = train(loaded, None, data, data.examples[:2], tmp_path / "m", cfg, medusa=heads)
    losses = [h["loss"] for h in progress["history"]]
    assert np.mean(losses[-3:]) < np.mean(losses[:3])
    assert len(progress["validations"][-1]["stream_accuracy"]) == 2
    after = dict(tree_flatten(loaded.model.parameters()))
    assert all(np.array_equal(v, np.array(after[k])) for k, v in base.items())
    folder = save_medusa(tmp_path / "heads", heads, loaded)
    again = load_medusa(folder, loaded, arch)
    for (name, a), (_, b) in zip(
        tree_flatten(heads.parameters()), tree_flatten(again.parameters()), strict=True
    ):
        assert np.array_equal(np.array(a), np.array(b)), name
    other = ss.load(str(tiny_folders["qwen2"]))
    with pytest.raises(ss.SpecstreamError, match="another base"):
        load_medusa(folder, other, arch_of(other.model, "qwen2"))
    with pytest.raises(ss.SpecstreamError, match="not a medusa folder"):
        load_medusa(tmp_path, loaded, arch)


def test_medusa_in_the_bench(tiny_folders, tmp_path):
    loaded = ss.load(str(tiny_folders["llama"]))
    folder = save_medusa(tmp_path / "heads", random_heads(loaded, 1, n_heads=3), loaded)
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"question_id": 1, "category": "x", "turns": ["a b a b a"]}\n')
    config = BenchConfig(
        suite="specbench",
        data=str(questions),
        max_tokens=10,
        methods=("ar", "medusa"),
        model=str(tiny_folders["llama"]),
        medusa=str(folder),
    )
    ar, medusa = run_bench(config)["methods"]
    assert medusa["identical_to_ar"] == 1.0
    assert medusa["extra_params"] == 3 * (64 * 64 + 64 + 259 * 64)
    with pytest.raises(ss.SpecstreamError, match="--medusa DIR"):
        run_bench(BenchConfig("specbench", str(questions), methods=("ar", "medusa")))


def test_cli_trains_medusa_heads(tiny_folders, tmp_path):
    from .test_cli import specstream

    data = tmp_path / "d.jsonl"
    data.write_text(
        "".join(
            json.dumps({"prompt": f"q{i}", "completion": "a b c d e f"}) + "\n" for i in range(6)
        )
    )
    out = tmp_path / "heads"
    proc = specstream(
        "train", "--mode", "medusa", "--data", str(data), "--out", str(out), "--model",
        str(tiny_folders["llama"]), "--gamma", "2", "--steps", "2", "--batch-size", "2",
        "--val-every", "2",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    loaded = ss.load(str(tiny_folders["llama"]))
    heads = load_medusa(out, loaded, arch_of(loaded.model, "llama"))
    assert heads.config.n_heads == 2
    assert not (tmp_path / "heads.checkpoint").exists()
