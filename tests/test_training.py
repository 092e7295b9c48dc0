"""Training stream adapters (lossless mode) on tiny models."""

import json
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models.cache import make_prompt_cache

import specstream_mlx as ss
from specstream_mlx.decoding.tree import draft_tree
from specstream_mlx.decoding.tree_step import tree_forward
from specstream_mlx.models.arch import arch_of
from specstream_mlx.streams.adapter_io import load_adapter, read_adapter, save_adapter
from specstream_mlx.streams.config import StreamConfig
from specstream_mlx.streams.params import StreamParams
from specstream_mlx.training import forward, positions, trainer
from specstream_mlx.training.data import Example, draft_vocabulary, load_dataset, read_jsonl
from specstream_mlx.training.trainer import Hooks, TrainConfig, train

from .conftest import QUIET


@pytest.fixture(scope="module")
def tiny(tiny_folders):
    return ss.load(str(tiny_folders["llama"]))


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    rows = [
        {"prompt": f"count from {i}", "completion": " ".join(str(i + k) for k in range(12))}
        for i in range(24)
    ]
    rows.append(
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello hello hello"},
            ]
        }
    )
    rows.append({"text": "plain text rows are learned everywhere " * 3})
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def params_for(loaded, seed=0, **config):
    mx.random.seed(seed)
    cfg = StreamConfig(gamma=3, n_msa_layers=2, top_k=2, **config)
    return StreamParams(cfg, loaded.config["hidden_size"]).randomize(seed)


@pytest.mark.parametrize("extra", ["", "guess", "attn"])
def test_loss_equals_decoder_computation(tiny, extra):
    """The training forward is the decoder's forward: NLL of each stream at each position,
    recomputed one position at a time with tree_forward on a single-node tree (with
    next_token_guess, the early-exit guess enters the streams in both; with attention_adapters,
    the attention path's adapters act in both)."""
    arch = arch_of(tiny.model, "llama")
    params = params_for(
        tiny, 1, next_token_guess=extra == "guess", attention_adapters=extra == "attn"
    )
    ids = [5, 17, 99, 23, 42, 8, 77, 61, 3, 12]
    mask = [False, False, True, True, True, True, True, True, True, True]
    feats = forward.base_features(arch, params.config.n_msa_layers, ids, mask)
    got = forward.stream_loss(arch, params, feats)
    for j in range(1, 4):
        nlls = []
        for p in range(len(ids) - 1 - j):
            if not mask[p + 1 + j]:
                continue
            cache = make_prompt_cache(tiny.model)
            if p:
                tiny.model(mx.array(ids[:p])[None], cache=cache)
            out = tree_forward(arch, params, draft_tree(ids[p], []), cache)
            logits = arch.lm_head(arch.norm(out.stream_hidden[0, j - 1])).astype(mx.float32)
            nlls.append((mx.logsumexp(logits) - logits[ids[p + 1 + j]]).item())
        assert got.stream_nll[j - 1].item() == pytest.approx(np.mean(nlls), abs=1e-4)
    assert got.total.item() == pytest.approx(
        sum(x.item() for x in got.stream_nll) + got.prune_nll.item(), rel=1e-6
    )


def test_self_targets_are_the_base_greedy_choices(tiny):
    """Self targets: position i is scored against the base's argmax from ids[:i]. On the base's
    own greedy answer they are the answer's tokens; on other text they are not, and the loss
    scores the streams against them."""
    arch = arch_of(tiny.model, "llama")
    params = params_for(tiny, 3)
    prompt = [5, 17, 99, 23, 42]
    answer = ss.generate(tiny, prompt, max_tokens=12).token_ids
    n_msa = params.config.n_msa_layers
    own = prompt + answer
    mask = [False] * len(prompt) + [True] * len(answer)
    feats = forward.base_features(arch, n_msa, own, mask, targets="self")
    assert feats.targets.tolist()[len(prompt) :] == answer

    rng = np.random.RandomState(4)
    text = prompt + [int(t) for t in rng.randint(3, 200, size=12)]
    feats = forward.base_features(arch, n_msa, text, mask, targets="self")
    logits = tiny.model(mx.array(text)[None])[0]
    assert feats.targets.tolist() == text[:1] + mx.argmax(logits, axis=-1).tolist()[:-1]
    assert feats.targets.tolist() != text
    by_text = forward.stream_loss(arch, params, forward.base_features(arch, n_msa, text, mask))
    by_self = forward.stream_loss(arch, params, feats)
    assert by_self.total.item() != pytest.approx(by_text.total.item(), rel=1e-3)


def test_soft_targets_score_the_base_distribution(tiny):
    """Soft targets keep the base's top tokens for each position's token (from the true prefix)
    and score stream j at position p by the mean of the cross-entropy to the base's greedy token
    and to that distribution, recomputed here by hand from the full-vocabulary softmaxes."""
    arch = arch_of(tiny.model, "llama")
    params = params_for(tiny, 5)
    rng = np.random.RandomState(6)
    ids = [int(t) for t in rng.randint(3, 200, size=14)]
    mask = [False] * 4 + [True] * 10
    n_msa, k = params.config.n_msa_layers, forward.SOFT_TOP_K
    feats = forward.base_features(arch, n_msa, ids, mask, targets="soft")
    base = np.array(mx.softmax(tiny.model(mx.array(ids)[None])[0].astype(mx.float32), axis=-1))
    soft_ids, soft_p = np.array(feats.soft.ids), np.array(feats.soft.probs)
    for i in range(1, len(ids)):  # row i: the base's distribution for token i
        top = np.argsort(-base[i - 1])[:k]
        assert set(soft_ids[i]) == set(top)
        want = base[i - 1][soft_ids[i]] / base[i - 1][top].sum()
        assert np.allclose(soft_p[i], want, atol=1e-5)
    assert feats.targets.tolist()[1:] == base.argmax(-1).tolist()[:-1]  # hard part: greedy

    got = forward.stream_loss(arch, params, feats)
    every = positions.stream_positions(feats.loss_mask, params.config.gamma)
    hidden = forward.stream_hidden(arch, params, feats, every)
    greedy = feats.targets.tolist()
    for j in range(1, params.config.gamma + 1):
        terms = []
        for n, p in enumerate(every):
            t = p + 1 + j
            if t >= len(ids) or not mask[t]:
                continue
            logits = arch.lm_head(arch.norm(hidden[n, j - 1])).astype(mx.float32)
            logp = np.array(logits - mx.logsumexp(logits))
            soft = -(soft_p[t] * logp[soft_ids[t]]).sum()
            terms.append(0.5 * (-logp[greedy[t]] + soft))
        assert got.stream_nll[j - 1].item() == pytest.approx(np.mean(terms), rel=1e-4)
    by_self = forward.stream_loss(
        arch, params, forward.base_features(arch, n_msa, ids, mask, "self")
    )
    assert by_self.total.item() != pytest.approx(got.total.item(), rel=1e-3)


def test_segment_loss_is_the_full_loss_on_those_positions(tiny):
    """Streams of different positions never see each other, so training on a segment of
    positions gives exactly those positions' terms of the full loss."""
    arch = arch_of(tiny.model, "llama")
    params = params_for(tiny, 2)
    rng = np.random.RandomState(0)
    ids = [int(t) for t in rng.randint(3, 200, size=40)]
    mask = [False] * 8 + [True] * 32
    feats = forward.base_features(arch, params.config.n_msa_layers, ids, mask)
    every = positions.stream_positions(feats.loss_mask, params.config.gamma)
    seg = positions.segment(every, 10, np.random.RandomState(3))
    assert len(seg) == 10 and list(seg) == list(range(seg[0], seg[0] + 10))
    full = forward.stream_hidden(arch, params, feats, every)
    part = forward.stream_hidden(arch, params, feats, seg)
    rows = [list(every).index(p) for p in seg]
    assert mx.allclose(full[mx.array(rows)], part, atol=1e-4).item()
    assert list(positions.segment(every, 0, rng)) == list(every)


@pytest.mark.parametrize("parents_only", [False, True])
def test_training_lowers_loss_and_never_touches_the_base(tiny, data_file, tmp_path, parents_only):
    """Every stream parameter receives gradient; with parents_only the parent heads alone train
    and everything else stays bit-identical."""
    before = {k: np.array(v) for k, v in tree_flatten(tiny.model.parameters())}
    data = load_dataset(data_file, tiny.tokenizer, 128)
    extra = dict(parent_rank=4) if parents_only else dict(attention_adapters=True)
    params = params_for(tiny, **extra)
    start = {k: np.array(v) for k, v in tree_flatten(params.parameters())}
    assert any(k.startswith(("attention_adapters.", "parent_heads.")) for k in start)
    progress = train(
        tiny,
        params,
        data,
        data.examples[:4],
        tmp_path / "a",
        TrainConfig(
            steps=12, batch_size=2, learning_rate=3e-3, val_every=12, parents_only=parents_only
        ),
        QUIET,
    )
    losses = [h["loss"] for h in progress["history"]]
    assert np.mean(losses[-3:]) < np.mean(losses[:3])
    after = dict(tree_flatten(tiny.model.parameters()))
    assert all(np.array_equal(before[k], np.array(after[k])) for k in before)  # bit-identical
    changed = {k for k, v in tree_flatten(params.parameters()) if not np.array_equal(start[k], v)}
    assert changed == {k for k in start if k.startswith("parent_heads.") or not parents_only}
    v = progress["validations"][-1]
    assert len(v["stream_accuracy"]) == 3 and v["tau_chain"] >= 1


def test_validation_reports_each_streams_dev_nll():
    """The validation record's stream_nll is each drafter's mean cross-entropy on its targets,
    over the scored positions only (the figure training logs, on held-out rows)."""
    rng = np.random.default_rng(0)
    gamma, vocab = 2, 7
    ex = Example(ids=rng.integers(0, vocab, 9).tolist(), loss_mask=[False] * 2 + [True] * 7)
    table = rng.normal(size=(9, gamma, vocab)).astype(np.float32)
    v = trainer.validate([ex], lambda i, rows: mx.array(table[rows]), gamma, top_k=2)
    rows = [p for p in range(9 - 1 - gamma) if all(ex.loss_mask[p + 1 : p + 2 + gamma])]
    logp = table - np.log(np.exp(table).sum(-1, keepdims=True))
    want = [-np.mean([logp[p, j, ex.ids[p + 2 + j]] for p in rows]) for j in range(gamma)]
    assert v.positions == len(rows) == 5
    assert v.stream_nll == pytest.approx(want, abs=1e-3)


def test_checkpoint_kill_resume_gives_the_same_state(tiny, data_file, tmp_path):
    data = load_dataset(data_file, tiny.tokenizer, 128)
    cfg = TrainConfig(steps=6, batch_size=2, learning_rate=3e-3, checkpoint_every=1, val_every=99)
    straight = params_for(tiny)
    train(tiny, straight, data, data.examples[:2], tmp_path / "straight", cfg, QUIET)
    resumed = params_for(tiny)
    train(
        tiny,
        resumed,
        data,
        data.examples[:2],
        tmp_path / "r",
        cfg,
        Hooks(stop_after=3, log=lambda s: None),
    )  # "killed" after 3 steps
    # each save replaced the checkpoint in one rename: no staging or old folders left beside it
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    again = params_for(tiny, seed=9)  # a new process: fresh parameters, state from the checkpoint
    messages = []
    progress = train(
        tiny, again, data, data.examples[:2], tmp_path / "r", cfg, Hooks(log=messages.append)
    )
    assert any("resuming from step 3" in m for m in messages)
    assert progress["step"] == 6
    for (name, a), (_, b) in zip(
        tree_flatten(straight.parameters()), tree_flatten(again.parameters()), strict=True
    ):
        assert mx.allclose(a, b, atol=1e-6).item(), name


def test_checkpoints_of_older_versions_resume(tiny, data_file, tmp_path):
    """A checkpoint written before a setting existed ran with its default: it resumes; one
    made with another value of it does not."""
    data = load_dataset(data_file, tiny.tokenizer, 128)
    cfg = TrainConfig(steps=4, batch_size=2, checkpoint_every=1, val_every=99)
    train(
        tiny,
        params_for(tiny),
        data,
        data.examples[:2],
        tmp_path / "r",
        cfg,
        Hooks(stop_after=2, log=lambda s: None),
    )
    path = tmp_path / "r.checkpoint" / "progress.json"
    progress = json.loads(path.read_text())
    del progress["train_config"]["lora_layers"], progress["train_config"]["targets"]
    del progress["stream_config"]["lora_blocks"]  # a StreamConfig field added later
    path.write_text(json.dumps(progress))
    messages = []
    train(
        tiny,
        params_for(tiny),
        data,
        data.examples[:2],
        tmp_path / "r",
        cfg,
        Hooks(log=messages.append),
    )
    assert any("resuming from step 2" in m for m in messages)
    other = TrainConfig(steps=4, batch_size=2, checkpoint_every=1, val_every=99, targets="self")
    with pytest.raises(ss.SpecstreamError, match="other settings \\(targets: 'text' -> 'self'\\)"):
        train(tiny, params_for(tiny), data, data.examples[:2], tmp_path / "r", other, QUIET)


@pytest.mark.parametrize("damage", ["progress", "step", "params", "optimizer"])
def test_a_broken_checkpoint_is_one_clear_error(tiny, data_file, tmp_path, damage):
    data = load_dataset(data_file, tiny.tokenizer, 128)
    cfg = TrainConfig(steps=4, batch_size=2, checkpoint_every=1, val_every=99)
    run = (tiny, params_for(tiny), data, data.examples[:2], tmp_path / "r", cfg)
    train(*run, Hooks(stop_after=1, log=lambda s: None))
    folder = tmp_path / "r.checkpoint"
    if damage == "progress":
        (folder / "progress.json").write_text("[]")
    elif damage == "step":  # past the run's last step: nothing would train or validate
        progress = json.loads((folder / "progress.json").read_text())
        (folder / "progress.json").write_text(json.dumps({**progress, "step": 9999}))
    elif damage == "params":
        (folder / "params.safetensors").write_bytes(b"\x00" * 10)
    else:
        (folder / "optimizer.safetensors").unlink()
    with pytest.raises(ss.SpecstreamError, match="unreadable checkpoint .*remove it"):
        train(*run, QUIET)


def test_adapters_with_nan_weights_are_never_written_or_read(tiny, tmp_path):
    params = params_for(tiny)
    folder = save_adapter(tmp_path / "good", params, tiny)
    weights = mx.load(str(folder / "adapters.safetensors"))
    name = sorted(weights)[0]
    weights[name] = mx.full(weights[name].shape, float("nan"))
    mx.save_safetensors(str(folder / "adapters.safetensors"), weights)
    with pytest.raises(ss.SpecstreamError, match="NaN or infinite values in 1 tensors.*retrain"):
        read_adapter(folder, tiny)
    params.update(tree_unflatten([(name, weights[name])]))
    with pytest.raises(ss.SpecstreamError, match="not writing .*NaN or infinite"):
        save_adapter(tmp_path / "bad", params, tiny)
    assert not (tmp_path / "bad").exists()


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tiny, data_file, tmp_path, monkeypatch):
    data = load_dataset(data_file, tiny.tokenizer, 128)
    real = forward.stream_loss
    calls = {"n": 0}

    def poisoned(*args):
        calls["n"] += 1
        out = real(*args)
        if calls["n"] > 4:  # steps 3+ (batch size 2)
            out.total = out.total * mx.array(float("nan"))
        return out

    monkeypatch.setattr(trainer, "stream_loss", poisoned)
    cfg = TrainConfig(steps=6, batch_size=2, checkpoint_every=1, val_every=99)
    with pytest.raises(ss.SpecstreamError, match="loss is nan at step 3.*checkpoint"):
        train(tiny, params_for(tiny), data, data.examples[:2], tmp_path / "a", cfg, QUIET)
    progress = json.loads((tmp_path / "a.checkpoint" / "progress.json").read_text())
    assert progress["step"] == 2


def test_data_formats_and_masks(tiny, data_file):
    data = load_dataset(data_file, tiny.tokenizer, 1000)
    assert len(data) == 26 and data.truncated == 0
    prompt_row = data.examples[0]
    completion = tiny.tokenizer.decode(
        [t for t, m in zip(prompt_row.ids, prompt_row.loss_mask, strict=True) if m]
    )
    assert completion.startswith("0 1 2 3") and "count from" not in completion
    text_row = data.examples[-1]
    assert all(text_row.loss_mask[1:])
    short = load_dataset(data_file, tiny.tokenizer, 20)
    assert short.truncated > 0 and all(len(e.ids) <= 20 for e in short.examples)


def test_malformed_jsonl_reports_line_numbers(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{not json\n{"foo": 1}\n\n{"prompt": "p", "completion": "c"}\n')
    with pytest.raises(ss.SpecstreamError, match="line 2: invalid JSON.*line 3: needs"):
        read_jsonl(bad)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ss.SpecstreamError, match="no examples"):
        read_jsonl(empty)


def test_rows_of_the_wrong_shape_are_reported_by_line(tmp_path):
    rows = [
        '{"text": 5}',
        '{"messages": "hello"}',
        '{"messages": [{"role": "user", "content": 5}]}',
        '{"messages": [{"content": "no role"}, {"role": "assistant", "content": "a"}]}',
        '{"messages": [{"role": "user", "content": "no answer"}]}',
        '{"prompt": 5, "completion": "x"}',
        '{"prompt": "p", "completion": ""}',
    ]
    bad = tmp_path / "types.jsonl"
    bad.write_text("\n".join(rows) + "\n")
    with pytest.raises(ss.SpecstreamError) as err:
        read_jsonl(bad)
    message = str(err.value)
    for line, why in [
        (1, '"text" must be a string'),
        (2, '"messages" must be a list'),
        (3, "every message needs a role"),
        (4, "every message needs a role"),
        (5, "no assistant message"),
        (6, '"prompt" must be a string'),
    ]:
        assert f"line {line}: {why}" in message
    assert "line 7" not in message  # an empty completion is a string: the row is read


@pytest.mark.parametrize("targets", ["text", "soft"])
def test_train_cli_writes_an_adapter_that_decodes_exactly(
    tiny_folders, data_file, tmp_path, targets
):
    out = tmp_path / "adapter"
    cmd = [
        sys.executable,
        "-m",
        "specstream_apps.cli",
        "train",
        "--model",
        str(tiny_folders["llama"]),
        "--data",
        str(data_file),
        "--out",
        str(out),
        "--gamma",
        "2",
        "--msa-layers",
        "2",
        "--steps",
        "4",
        "--batch-size",
        "2",
        "--val-every",
        "2",
        "--targets",
        targets,
        *(["--attention-adapters"] if targets == "soft" else []),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["training"]["train_config"]["targets"] == targets
    assert (
        config["training"]["data"]["examples"] == 25  # 26 rows, the last held out
        and config["training"]["data"]["held_out_for_validation"] == 1
        and "tau_chain" in config["training"]["validation"]
    )
    assert not (tmp_path / "adapter.checkpoint").exists()
    curve = config["training"]["loss_curve"]  # every step once, in order, as window means
    assert [s for w in curve for s in range(w["steps"][0], w["steps"][1] + 1)] == [1, 2, 3, 4]
    assert all(np.isfinite(w["loss"]) for w in curve)
    loaded = ss.load(str(tiny_folders["llama"]), adapter=str(out))
    assert loaded.streams.config.gamma == 2
    assert loaded.streams.config.attention_adapters == (targets == "soft")
    plain = ss.generate(loaded, "count from 3", max_tokens=16)
    spec = ss.generate(loaded, "count from 3", max_tokens=16, decoder="ss")
    assert spec.token_ids == plain.token_ids
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 2 and "exists" in again.stderr
    assert load_adapter(out, loaded).config == loaded.streams.config


@pytest.mark.parametrize("targets", ["self", "soft"])
def test_self_targets_only_for_lossless_streams(tiny_folders, data_file, tmp_path, targets):
    proc = subprocess.run(
        [sys.executable, "-m", "specstream_apps.cli", "train", "--model",
         str(tiny_folders["llama"]), "--data", str(data_file), "--out", str(tmp_path / "a"),
         "--mode", "shared", "--targets", targets],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().endswith(
        f"error: --targets {targets} is for --mode lossless, not shared"
    )


@pytest.mark.parametrize("mode", ["shared", "next-token"])
def test_lora_layers_train_the_top_blocks_on_cached_features(
    tiny_folders, data_file, tmp_path, mode
):
    """TrainConfig.lora_layers: the loss from the cached output of the frozen blocks equals the
    whole model's (their LoRA is zero), only the top blocks' LoRA moves, and every layer's LoRA
    is trainable again afterwards."""
    from specstream_mlx.streams.lora import apply_lora, remove_lora

    loaded = ss.load(str(tiny_folders["llama"]))
    arch = arch_of(loaded.model, "llama")
    apply_lora(loaded.model, 4, 20.0)
    try:
        params = None
        if mode == "shared":
            cfg = StreamConfig(gamma=2, n_msa_layers=2, top_k=1, mode="shared", lora_rank=4)
            params = StreamParams(cfg.validate(4), loaded.config["hidden_size"]).randomize(2)
        data = load_dataset(data_file, loaded.tokenizer, 128)
        ex = data.examples[3]
        frozen = forward.Frozen.of(arch, ex.ids, 2)
        for i in (2, 3):  # the top blocks' LoRA does something
            proj = loaded.model.model.layers[i].self_attn.q_proj
            proj.lora_b = 0.1 * mx.random.normal(proj.lora_b.shape, key=mx.random.key(i))
        if params is not None:
            whole = forward.shared_loss(arch, params, ex.ids, ex.loss_mask).total
            cached = forward.shared_loss(arch, params, ex.ids, ex.loss_mask, frozen).total
        else:
            whole = forward.next_token_loss(loaded.model, ex.ids, ex.loss_mask)[0]
            cached = forward.next_token_loss(loaded.model, ex.ids, ex.loss_mask, (arch, frozen))[0]
        assert cached.item() == pytest.approx(whole.item(), rel=1e-5)

        def lora():
            return {k: np.array(v) for k, v in tree_flatten(loaded.model.parameters())
                    if k.endswith(("lora_a", "lora_b"))}  # fmt: skip

        before = lora()
        train(
            loaded,
            params,
            data,
            data.examples[:2],
            tmp_path / "a",
            TrainConfig(steps=3, batch_size=2, lora_learning_rate=1e-2, val_every=3, lora_layers=2),
            QUIET,
        )
        moved = {k for k, v in lora().items() if not np.array_equal(before[k], v)}
        assert moved and all(k.startswith(("model.layers.2.", "model.layers.3.")) for k in moved)
        trainable = {k for k, _ in tree_flatten(loaded.model.trainable_parameters())}
        assert trainable == set(before)  # the frozen blocks' LoRA is trainable again
        with pytest.raises(ss.SpecstreamError, match="lora_layers must be in"):
            bad = TrainConfig(steps=1, lora_layers=1 if params else 5)
            train(loaded, params, data, data.examples[:2], tmp_path / "b", bad, Hooks(log=print))
    finally:
        remove_lora(loaded.model)


def test_lora_layers_only_where_lora_trains(tiny, data_file, tmp_path):
    data = load_dataset(data_file, tiny.tokenizer, 128)
    with pytest.raises(ss.SpecstreamError, match="lora_layers is for the LoRA"):
        train(
            tiny,
            params_for(tiny),
            data,
            data.examples[:2],
            tmp_path / "a",
            TrainConfig(steps=1, lora_layers=2),
            QUIET,
        )


def test_loss_curve_keeps_every_step_as_window_means():
    from specstream_mlx.training.history import loss_curve

    history = [{"step": s, "loss": float(s * s)} for s in range(1, 11)]
    curve = loss_curve(history, points=4)  # windows of 3 steps, the last one shorter
    assert [w["steps"] for w in curve] == [[1, 3], [4, 6], [7, 9], [10, 10]]
    assert [w["loss"] for w in curve] == [
        round(14 / 3, 4),
        round(77 / 3, 4),
        round(194 / 3, 4),
        100.0,
    ]
    assert loss_curve([]) == []


def test_parent_heads_read_the_decoders_parent_in_training(tiny):
    """Stream 1's logits in parent-head training (self targets: the base's own greedy token is
    each target's parent) equal the decoder's for the same position, which reads the main
    stream's greedy token there; a stream j's read its true parent token."""
    arch = arch_of(tiny.model, "llama")
    params = params_for(tiny, 2, parent_rank=4)
    ids = [5, 17, 99, 23, 42, 8, 77, 61, 3, 12]
    mask = [False, False, True, True, True, True, True, True, True, True]
    feats = forward.base_features(arch, params.config.n_msa_layers, ids, mask, "self")
    states = forward.StreamStates.of(arch, params, feats)
    for p in (1, 3, 5):
        cache = make_prompt_cache(tiny.model)
        tiny.model(mx.array(ids[:p])[None], cache=cache)
        out = tree_forward(arch, params, draft_tree(ids[p], []), cache)
        decoder = out.streams_of(arch, params, 0)[0]
        row = int(np.searchsorted(states.positions, p))
        head = params.parent_heads[0]
        h = head(states.hidden[row, 0][None], arch.embed(feats.targets[p + 1][None]))
        trained = arch.lm_head(arch.norm(h))[0]
        assert mx.abs(decoder - trained).max().item() < 1e-4
    _, nll = forward.parent_loss(arch, params, states, states.positions)
    targets = np.array(feats.targets)
    for j in range(1, 4):
        rows = [i for i, p in enumerate(states.positions) if p + 1 + j < len(ids)]
        rows = [i for i in rows if mask[states.positions[i] + 1 + j]]
        at = mx.array([int(states.positions[i]) for i in rows])
        h = params.parent_heads[j - 1](
            states.hidden[mx.array(rows), j - 1], arch.embed(mx.array(targets)[at + j])
        )
        logits = arch.lm_head(arch.norm(h)).astype(mx.float32)
        want = (
            mx.logsumexp(logits, axis=-1)
            - logits[mx.arange(len(rows)), mx.array(targets)[at + 1 + j]]
        )
        assert nll[j - 1].item() == pytest.approx(want.mean().item(), abs=1e-4)


def test_train_cli_adds_parent_heads_to_a_trained_adapter(tiny_folders, tiny, data_file, tmp_path):
    source = save_adapter(tmp_path / "streams", params_for(tiny, 4), tiny)
    base = [sys.executable, "-m", "specstream_apps.cli", "train", "--model",
            str(tiny_folders["llama"]), "--data", str(data_file), "--steps", "3",
            "--batch-size", "2", "--val-every", "3"]  # fmt: skip
    out = tmp_path / "parents"
    cmd = [*base, "--out", str(out), "--parent-rank", "4", "--from", str(source)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["stream_config"]["parent_rank"] == 4
    assert config["training"]["streams_from"]["adapter"] == str(source)
    assert config["training"]["train_config"]["parents_only"] is True
    was = read_adapter(source, tiny).streams
    now = read_adapter(out, tiny).streams
    own = dict(tree_flatten(now.parameters()))
    for name, value in tree_flatten(was.parameters()):
        assert np.array_equal(np.array(value), np.array(own.pop(name))), name
    assert own and all(name.startswith("parent_heads.") for name in own)
    loaded = ss.load(str(tiny_folders["llama"]), adapter=str(out))
    plain = ss.generate(loaded, "count from 3", max_tokens=16)
    spec = ss.generate(loaded, "count from 3", max_tokens=16, decoder="ss")
    assert spec.token_ids == plain.token_ids
    alone = subprocess.run(
        [*base, "--out", str(tmp_path / "b"), "--from", str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert alone.returncode == 2
    assert alone.stderr.strip().endswith(
        "error: --from trains parent heads: it needs --parent-rank"
    )


def test_train_cli_adds_parent_heads_and_a_draft_vocabulary_to_a_shared_adapter(
    tiny_folders, data_file, tmp_path
):
    """--from a shared adapter: its LoRA and streams are kept bit for bit, only the heads
    train (through its LoRA), and --draft-vocab keeps the training targets' commonest tokens;
    the result decodes exactly."""
    base = [sys.executable, "-m", "specstream_apps.cli", "train", "--model",
            str(tiny_folders["llama"]), "--data", str(data_file), "--steps", "3",
            "--batch-size", "2", "--val-every", "3", "--mode", "shared",
            "--msa-layers", "2"]  # fmt: skip
    source, out = tmp_path / "shared", tmp_path / "parents"
    for cmd in ([*base, "--out", str(source)],
                [*base, "--out", str(out), "--parent-rank", "4", "--from", str(source),
                 "--draft-vocab", "8"]):  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
    loaded = ss.load(str(tiny_folders["llama"]))
    data = load_dataset(data_file, loaded.tokenizer, 512)
    data.hold_out(1)  # as the CLI does: a twentieth, at least one
    config = json.loads((out / "adapter_config.json").read_text())["stream_config"]
    assert config["parent_rank"] == 4 and config["mode"] == "shared"
    assert tuple(config["draft_vocab"]) == draft_vocabulary(data.examples, 8)
    was, now = read_adapter(source, loaded), read_adapter(out, loaded)
    assert was.lora.keys() == now.lora.keys()
    assert all(mx.array_equal(was.lora[k], now.lora[k]) for k in was.lora)
    own = dict(tree_flatten(now.streams.parameters()))
    for name, value in tree_flatten(was.streams.parameters()):
        assert mx.array_equal(value, own.pop(name)), name
    assert own and all(name.startswith("parent_heads.") for name in own)
    loaded = ss.load(str(tiny_folders["llama"]), adapter=str(out))
    plain = ss.generate(loaded, "count from 3", max_tokens=16)
    spec = ss.generate(loaded, "count from 3", max_tokens=16, decoder="ss")
    assert spec.token_ids == plain.token_ids


def test_train_cli_refuses_a_draft_vocabulary_it_could_not_load(tiny_folders, data_file, tmp_path):
    """--draft-vocab smaller than the streams' top-k, or larger than the model's vocabulary,
    is refused before training, with nothing written (it used to save an adapter that no
    reader loads)."""
    from .test_cli import assert_clean_error

    base = [sys.executable, "-m", "specstream_apps.cli", "train", "--model",
            str(tiny_folders["llama"]), "--data", str(data_file), "--steps", "2",
            "--batch-size", "2", "--mode", "lossless", "--msa-layers", "2",
            "--tree-top-k", "3", "--out", str(tmp_path / "out")]  # fmt: skip
    for size, fragment in (("2", "--tree-top-k"), ("100000", "the model has")):
        proc = subprocess.run([*base, "--draft-vocab", size], capture_output=True, text=True)
        assert_clean_error(proc, f"--draft-vocab {size}", fragment)
        assert not any(tmp_path.iterdir())  # no adapter, no checkpoint


def test_draft_vocab_script_adds_a_vocabulary_to_a_trained_adapter(
    tiny_folders, tiny, data_file, tmp_path
):
    """scripts/draft_vocab.py: the commonest targets of --data in a copy of the folder, its
    weights and statistics unchanged; an existing output is refused without --overwrite."""
    source = save_adapter(tmp_path / "streams", params_for(tiny, 4), tiny)
    out = tmp_path / "vocab"
    cmd = [sys.executable, "scripts/draft_vocab.py", "--model", str(tiny_folders["llama"]),
           "--adapter", str(source), "--data", str(data_file), "--size", "8",
           "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    config = json.loads((out / "adapter_config.json").read_text())
    examples = load_dataset(data_file, tiny.tokenizer, 512).examples
    assert tuple(config["stream_config"]["draft_vocab"]) == draft_vocabulary(examples, 8)
    name = "adapters.safetensors"
    assert (out / name).read_bytes() == (source / name).read_bytes()
    assert read_adapter(out, tiny).streams.config.draft_vocab == draft_vocabulary(examples, 8)
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 2 and "exists" in again.stderr
    for size in ("-5", "0"):  # refused before any model loads
        cmd[cmd.index("--size") + 1], cmd[-1] = size, str(tmp_path / "none")
        bad = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert bad.returncode == 2 and "--size" in bad.stderr, bad.stderr
        assert not (tmp_path / "none").exists()


def test_draft_vocabulary_is_the_commonest_targets():
    examples = [Example([1, 5, 5, 7, 9], [False, True, True, True, False]),
                Example([5, 7, 2, 2], [False, True, True, True])]  # fmt: skip
    # targets 5 x2 (the prompt's 1 and 5 and the masked 9 do not count), 7 x2, 2 x2
    assert draft_vocabulary(examples, 2) == (2, 5)  # ties: the lower id
    assert draft_vocabulary(examples, 9) == (2, 5, 7)
    with pytest.raises(ss.SpecstreamError, match="no target tokens"):
        draft_vocabulary([Example([1, 2], [False, False])], 4)
    with pytest.raises(ss.SpecstreamError, match="at least one token, got size 0"):
        draft_vocabulary(examples, 0)


def test_train_cli_trains_a_shared_adapter_whose_main_stream_ignores_its_streams(
    tiny_folders, data_file, tmp_path
):
    """--main-ignores-streams: the adapter records main_reads_streams false and `ss` decodes
    the tokens of its LoRA alone (its streams taken off); lossless mode refuses the flag."""
    from .test_cli import assert_clean_error

    base = [sys.executable, "-m", "specstream_apps.cli", "train", "--model",
            str(tiny_folders["llama"]), "--data", str(data_file), "--steps", "3",
            "--batch-size", "2", "--val-every", "3", "--msa-layers", "2",
            "--main-ignores-streams"]  # fmt: skip
    out = tmp_path / "blind"
    proc = subprocess.run([*base, "--mode", "shared", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    config = json.loads((out / "adapter_config.json").read_text())["stream_config"]
    assert (config["mode"], config["main_reads_streams"]) == ("shared", False)
    loaded = ss.load(str(tiny_folders["llama"]), adapter=str(out))
    spec = ss.generate(loaded, "count from 3", max_tokens=16, decoder="ss", tree="adapter")
    streams, loaded.streams = loaded.streams, None
    assert spec.token_ids == ss.generate(loaded, "count from 3", max_tokens=16).token_ids
    assert streams is not None and spec.decoder == "ss"
    refused = subprocess.run([*base, "--mode", "lossless", "--out", str(tmp_path / "no")],
                             capture_output=True, text=True, timeout=300)  # fmt: skip
    assert_clean_error(refused, "--main-ignores-streams is for --mode shared, not lossless")
    refused = subprocess.run([*base, "--mode", "shared", "--parent-rank", "4", "--from", str(out),
                              "--out", str(tmp_path / "no")],
                             capture_output=True, text=True, timeout=300)  # fmt: skip
    assert_clean_error(refused, "--from keeps the adapter's own setting")
    assert not (tmp_path / "no").exists()
