"""The PyTorch path (convert/): parity with the MLX runtime on the same weights and adapters, the
torch decoder's exactness, the converter's round trips and its refusals."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlx.utils import tree_flatten, tree_unflatten
from safetensors.numpy import load_file, save_file
from specstream_apps.cli import main as cli

import specstream_mlx as ss
from convert import adapter_format as af
from convert.parity import decode_both, mlx_stream_logits, one_tree_step
from convert.torch_adapter import add_lora, load_torch_adapter, save_torch_adapter
from convert.torch_base import ChatTokenizer, load_base
from convert.torch_streams import (
    TorchStreams,
    View,
    hf_greedy,
    speculative_decode,
)
from convert.torch_train import TrainConfig, train
from specstream_mlx.decoding.policy import TreePolicy
from specstream_mlx.decoding.tree import draft_tree
from specstream_mlx.generate import encode_prompt
from specstream_mlx.models.arch import arch_of
from specstream_mlx.streams.adapter_io import SHIPPED_DIR, attach, load_adapter, save_adapter
from specstream_mlx.streams.config import StreamConfig
from specstream_mlx.streams.lora import apply_lora, lora_block, remove_lora
from specstream_mlx.streams.params import StreamParams
from specstream_mlx.training.data import load_dataset

TORCH_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")  # phi3 fuses q/k/v: MLX only
TOL = 1e-4


@pytest.fixture(scope="module")
def pairs(tiny_folders):
    """family -> (MLX LoadedModel, TorchBase) of the same tiny folder."""
    return {
        f: (ss.load(str(tiny_folders[f])), load_base(str(tiny_folders[f]))) for f in TORCH_FAMILIES
    }


def mlx_adapter(loaded, folder, mode, seed=0, **config):
    """A saved MLX adapter with random streams (and random LoRA in shared mode)."""
    cfg = StreamConfig(mode=mode, **config).validate(loaded.config["num_hidden_layers"])
    params = StreamParams(cfg, loaded.config["hidden_size"]).randomize(seed)
    if mode == "shared":
        apply_lora(loaded.model, cfg.lora_rank, cfg.lora_scale)
        lora = tree_flatten(loaded.model.trainable_parameters())
        keys = mx.random.split(mx.random.key(seed + 1), len(lora))
        loaded.model.update(
            tree_unflatten(
                [
                    (n, mx.random.normal(v.shape, key=k) * 0.05)
                    for (n, v), k in zip(lora, keys, strict=True)
                ]
            )
        )
    try:
        return save_adapter(folder, params, loaded), params
    finally:
        if mode == "shared":
            remove_lora(loaded.model)


def streams_agree(mlx_stream: np.ndarray, torch_stream: np.ndarray) -> None:
    """Both runtimes' stream logits: -inf at the same tokens (those outside a draft
    vocabulary), within TOL everywhere else."""
    drafted = np.isfinite(mlx_stream)
    assert (drafted == np.isfinite(torch_stream)).all() and drafted.any()
    assert np.abs(mlx_stream[drafted] - torch_stream[drafted]).max() < TOL


@pytest.mark.parametrize("family", TORCH_FAMILIES)
@pytest.mark.parametrize(
    "mode",
    [
        "lossless",
        "shared",
        "lossless+guess",
        "shared+attn",
        "lossless+parent",
        "shared+parent+vocab",
    ],
)
def test_tiny_logits_tokens_and_tau_agree_with_mlx(pairs, family, mode, tmp_path):
    loaded, base = pairs[family]
    config = dict(gamma=3, top_k=2, n_msa_layers=2, max_tree_nodes=6, prune_threshold=0.01)
    mode, *extra = mode.split("+")
    config["next_token_guess"] = "guess" in extra
    config["attention_adapters"] = "attn" in extra
    config["parent_rank"] = 4 if "parent" in extra else 0
    config["draft_vocab"] = (
        tuple(range(0, loaded.config["vocab_size"], 3)) if "vocab" in extra else None
    )
    folder, params = mlx_adapter(loaded, tmp_path / "a", mode, seed=3, **config)
    params = load_adapter(folder, loaded)
    streams = load_torch_adapter(folder, base)  # an MLX folder, converted in memory
    try:
        prompt = encode_prompt(loaded, "parity of the two runtimes")
        tree = draft_tree(prompt[-1], [[5, 70], [9, 11], [100, 3]])
        out, survivors, main, stream = one_tree_step(loaded, params, base, streams, prompt, tree)
        assert survivors == out.survivors and len(survivors) < len(tree)  # pruned alike
        assert np.abs(np.array(out.main_logits) - main).max() < TOL
        streams_agree(mlx_stream_logits(loaded, params, out), stream)
        m, t = decode_both(loaded, params, base, streams, prompt, 24)
        assert [s.tokens for s in m] == [s.tokens for s in t]  # tokens, and per pass: tau
        assert [s.tree_nodes_kept for s in m] == [s.tree_nodes_kept for s in t]
    finally:
        remove_lora(loaded.model)
        if mode == "shared":
            from convert.torch_adapter import remove_lora as remove_torch_lora

            remove_torch_lora(base)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    family=st.sampled_from(TORCH_FAMILIES),
    gamma=st.integers(1, 4),
    top_k=st.integers(1, 3),
    n_msa=st.integers(1, 3),
    threshold=st.sampled_from([0.0, 1e-3, 0.2]),
    cap=st.integers(1, 20),
    prompt=st.lists(st.integers(0, 255), min_size=1, max_size=20),
    length=st.integers(1, 20),
    noise=st.integers(0, 3),
    seed=st.integers(0, 1000),
)
def test_torch_lossless_decoder_equals_plain_greedy(
    pairs, family, gamma, top_k, n_msa, threshold, cap, prompt, length, noise, seed
):
    """Whatever the drafts (an oracle's true continuation with wrong tokens mixed in, so that
    paths of every length are accepted), the tokens are those of transformers' own greedy
    decoding."""
    _, base = pairs[family]
    cfg = StreamConfig(
        gamma=gamma, top_k=top_k, n_msa_layers=n_msa, prune_threshold=threshold, max_tree_nodes=cap
    )
    streams = TorchStreams(cfg, base.config["hidden_size"]).randomize(seed)
    truth = hf_greedy(base.model, prompt, length + gamma + 1)
    rng = np.random.RandomState(seed)

    def oracle(history):
        done = len(history) - len(prompt)
        out = []
        for j in range(gamma):
            right = truth[done + j] if done + j < len(truth) else 0
            wrong = [int(x) for x in rng.randint(0, 256, size=top_k)]
            row = wrong if rng.randint(0, 4) < noise else [right] + wrong[1:]
            out.append([row[(i + rng.randint(0, top_k)) % top_k] for i in range(top_k)])
        return out

    steps = list(speculative_decode(base.model, streams, prompt, length, draft_override=oracle))
    assert [t for s in steps for t in s.tokens] == truth[:length]
    random_streams = list(speculative_decode(base.model, streams, prompt, length))
    assert [t for s in random_streams for t in s.tokens] == truth[:length]


@pytest.mark.parametrize("main_reads", [True, False])
def test_torch_shared_decoder_equals_its_plain_decoding(pairs, tmp_path, main_reads):
    """The torch decoder of a shared adapter is exact against its plain decoding; where the
    main stream ignores the streams (strong ones here), that is the LoRA model's own greedy."""
    from convert.torch_adapter import remove_lora as remove_torch_lora

    loaded, base = pairs["qwen2"]
    folder, _ = mlx_adapter(
        loaded, tmp_path / "a", "shared", 5, gamma=2, n_msa_layers=2, main_reads_streams=main_reads
    )
    streams = load_torch_adapter(folder, base)
    try:
        prompt = list(range(40, 60))
        if not main_reads:
            with torch.no_grad():
                streams.stream_embeddings.mul_(50)
        plain = speculative_decode(base.model, streams, prompt, 20, draft=False)
        plain = [t for s in plain for t in s.tokens]
        if not main_reads:
            assert plain == hf_greedy(base.model, prompt, 20)
        truth = plain + [0] * 4

        def oracle(history):
            done = len(history) - len(prompt)
            return [[truth[done + j]] for j in range(2)]

        steps = list(speculative_decode(base.model, streams, prompt, 20, draft_override=oracle))
        assert [t for s in steps for t in s.tokens] == plain
        assert max(len(s.tokens) for s in steps) == 3  # drafts were accepted
    finally:
        remove_torch_lora(base)


@pytest.mark.parametrize(
    "mode, extra",
    [
        ("lossless", {}),
        ("lossless", {"targets": "self"}),
        ("shared", {}),
        ("shared", {"prompt_streams": True}),
        ("shared", {"shared_stream_adapters": False}),
        ("shared", {"main_reads_streams": False}),
    ],
)
def test_training_loss_equals_the_mlx_trainers(pairs, tmp_path, mode, extra):
    """The torch trainer's loss of eq. 6 on one sequence equals the MLX trainer's, term by term
    (same weights, same adapter); the shared-mode variants also decode alike."""
    from convert.torch_adapter import remove_lora as remove_torch_lora
    from convert.torch_train import sequence_loss
    from specstream_mlx.training import forward, positions

    loaded, base = pairs["llama"]
    extra = dict(extra)
    targets = extra.pop("targets", "text")
    config = dict(gamma=3, n_msa_layers=2, top_k=2, max_tree_nodes=6, **extra)
    folder, _ = mlx_adapter(loaded, tmp_path / "a", mode, seed=1, **config)
    params = load_adapter(folder, loaded)
    streams = load_torch_adapter(folder, base)
    try:
        rng = np.random.RandomState(0)
        ids = rng.randint(0, 250, size=30).tolist()
        mask = [False] * 10 + [True] * 20
        arch = arch_of(loaded.model, loaded.config["model_type"])
        segment = None
        if mode == "lossless":  # on a segment of the positions, as training runs it
            feats = forward.base_features(arch, params.config.n_msa_layers, ids, mask, targets)
            segment = positions.stream_positions(np.array(mask), 3)[3:9]
            theirs = forward.stream_loss(arch, params, feats, segment)
        else:
            theirs = forward.shared_loss(arch, params, ids, mask)
        with torch.no_grad():
            ours = sequence_loss(View(base.model), streams, ids, mask, segment, targets)
        assert float(ours.total) == pytest.approx(float(theirs.total), abs=1e-4)
        assert ours.prune_nll == pytest.approx(float(theirs.prune_nll), abs=1e-4)
        assert ours.stream_nll == pytest.approx([float(x) for x in theirs.stream_nll], abs=1e-4)
        if mode == "shared":
            assert ours.main_nll == pytest.approx(float(theirs.main_nll), abs=1e-4)
            m, t = decode_both(loaded, params, base, streams, ids[:12], 16)
            assert [s.tokens for s in m] == [s.tokens for s in t]
    finally:
        remove_lora(loaded.model)
        remove_torch_lora(base)


def test_next_token_loss_equals_the_mlx_trainers(pairs, tmp_path):
    """`--mode next-token` (the LoRA baseline) scores two sequences packed into one pass as the
    MLX trainer's next-token loss scores each alone, on the same LoRA."""
    from convert.torch_adapter import remove_lora as remove_torch_lora
    from convert.torch_train import Sequence, next_token_loss
    from specstream_mlx.training import forward

    loaded, base = pairs["llama"]
    folder, _ = mlx_adapter(loaded, tmp_path / "a", "shared", seed=2, gamma=3, n_msa_layers=2)
    load_adapter(folder, loaded)
    load_torch_adapter(folder, base)
    try:
        rng = np.random.RandomState(1)
        batch = [
            Sequence(rng.randint(0, 250, size=n).tolist(), [False] * 6 + [True] * (n - 6))
            for n in (17, 25)
        ]
        theirs = [
            float(forward.next_token_loss(loaded.model, s.ids, s.loss_mask)[0]) for s in batch
        ]
        with torch.no_grad():
            ours = next_token_loss(View(base.model), batch)
        assert float(ours.total) == pytest.approx(sum(theirs), abs=1e-4)
        assert ours.main_nll == pytest.approx(np.mean(theirs), abs=1e-4) and not ours.stream_nll
    finally:
        remove_lora(loaded.model)
        remove_torch_lora(base)


def test_torch_optimizer_takes_the_mlx_trainers_steps():
    """The torch trainer's AdamW, under its per-step rates, moves a parameter as the MLX
    trainer's optimizer does (schedule and MLX's Adam without bias correction) over the same
    gradients: warmup, early steps (where the two Adams differ most) and decay."""
    from convert.torch_train import TrainConfig as TorchConfig
    from convert.torch_train import set_rates
    from specstream_mlx.training.trainer import TrainConfig as MlxConfig
    from specstream_mlx.training.trainer import adamw

    steps, warmup, lr = 12, 3, 3e-3
    rng = np.random.RandomState(0)
    start = rng.normal(size=(4, 5)).astype(np.float32)
    grads = [
        rng.normal(size=start.shape).astype(np.float32) * 10 ** rng.uniform(-3, 1)
        for _ in range(steps)
    ]
    theirs = adamw(MlxConfig(steps=steps, warmup=warmup, learning_rate=lr), lr)
    param = {"w": mx.array(start)}
    ours_w = torch.nn.Parameter(torch.tensor(start))
    ours = torch.optim.AdamW([ours_w], lr=lr, weight_decay=0.0)
    cfg = TorchConfig(steps=steps, warmup=warmup, learning_rate=lr)
    for step, g in enumerate(grads, start=1):
        param = theirs.apply_gradients({"w": mx.array(g)}, param)
        set_rates(ours, [lr], step, cfg)
        ours_w.grad = torch.tensor(g)
        ours.step()
        np.testing.assert_allclose(
            ours_w.detach().numpy(),
            np.array(param["w"]),
            rtol=1e-4,
            atol=1e-6,
            err_msg=f"step {step}",
        )
    assert not np.allclose(np.array(param["w"]), start)


@pytest.mark.parametrize(
    "mode, targets", [("lossless", "text"), ("lossless", "self"), ("shared", "text")]
)
def test_a_packed_batch_gives_each_sequences_loss_and_gradient(pairs, tmp_path, mode, targets):
    """The trainer's step packs its sequences end to end into one pass (batch_loss): the total
    and its gradients are the sum of the sequences' own (sequence_loss), the logged NLLs their
    means, the hit counts their sums: no token sees, or is scored against, another sequence."""
    from convert.torch_adapter import remove_lora as remove_torch_lora
    from convert.torch_train import Sequence, _lora_params, batch_loss, sequence_loss
    from specstream_mlx.training import positions

    loaded, base = pairs["llama"]
    folder, _ = mlx_adapter(loaded, tmp_path / "a", mode, seed=2, gamma=3, n_msa_layers=2)
    streams = load_torch_adapter(folder, base)
    try:
        rng = np.random.RandomState(3)
        batch = []
        for length, prompt in [(14, 5), (9, 7), (21, 3)]:
            mask = [False] * prompt + [True] * (length - prompt)
            every = positions.stream_positions(np.array(mask), 3)
            segment = every[1:6] if mode == "lossless" and len(every) else None
            batch.append(Sequence(rng.randint(0, 250, size=length).tolist(), mask, segment))
        params = [p for p in streams.parameters()] + list(_lora_params(base.model).values())
        for p in params:
            p.requires_grad_(True)

        def grads(loss):
            return torch.autograd.grad(loss, params, allow_unused=True)

        view = View(base.model)
        alone = [
            sequence_loss(view, streams, s.ids, s.loss_mask, s.positions, targets) for s in batch
        ]
        packed = batch_loss(view, streams, batch, targets=targets)
        assert float(packed.total.detach()) == pytest.approx(
            sum(float(a.total.detach()) for a in alone), abs=1e-4
        )
        mean = np.mean([a.stream_nll for a in alone], axis=0)
        assert packed.stream_nll == pytest.approx(mean.tolist(), abs=1e-4)
        assert packed.prune_nll == pytest.approx(np.mean([a.prune_nll for a in alone]), abs=1e-4)
        if mode == "shared":
            assert packed.main_nll == pytest.approx(np.mean([a.main_nll for a in alone]), abs=1e-4)
            # --stream-weight: the streams' terms alone change with it
            lighter = batch_loss(view, streams, batch, targets=targets, alpha_stream=0.05)
            assert float((packed.total - lighter.total).detach()) == pytest.approx(
                0.05 * sum(packed.stream_nll) * len(batch), rel=1e-4
            )
        hits = [
            tuple(map(sum, zip(*h, strict=True)))
            for h in zip(*[a.stream_hits for a in alone], strict=True)
        ]
        assert packed.stream_hits == hits and hits[0][1] > 0
        together = grads(packed.total)
        one_by_one = [grads(a.total) for a in alone]
        for i, g in enumerate(together):
            parts = [o[i] for o in one_by_one if o[i] is not None]
            if g is None:
                assert not parts
                continue
            assert torch.allclose(g, sum(parts), atol=1e-4, rtol=1e-3)
    finally:
        remove_torch_lora(base)


@pytest.fixture(scope="module")
def default_pair(default_model):
    return default_model, load_base()


def test_default_model_same_weights_and_logits(default_pair):
    loaded, base = default_pair
    ours = dict(tree_flatten(loaded.model.parameters()))
    theirs = base.model.state_dict()
    assert base.model.lm_head.weight is base.model.model.embed_tokens.weight  # tied, as in MLX
    assert set(ours) == set(theirs) - {"lm_head.weight"}
    for name, value in ours.items():  # the same GGUF, dequantized alike: bit for bit
        assert np.array_equal(np.array(value), theirs[name].numpy()), name
    ids = encode_prompt(loaded, "What is the capital of France?")
    mlx_logits = np.array(loaded.model(mx.array(ids)[None])[0])  # (37, 49152)
    with torch.inference_mode():
        torch_logits = base.model(torch.tensor([ids])).logits[0].numpy()
        exact = load_base(dtype="float64").model(torch.tensor([ids])).logits[0].numpy()
    # Over 37 x 49152 logits (|logit| up to 38) each runtime's float32 rounding stays within
    # a few float32 ulps of the largest logit from the float64 computation of the same weights
    # (how many depends on the machine's BLAS kernels: 1.08e-4 measured on one dev machine,
    # under 1e-4 on another); they differ from each other by up to the sum, not more. A wrong
    # weight or layer moves logits by far more (units).
    tol = 5e-6 * np.abs(exact).max()  # 1.9e-4 here: about 50 ulps of float32 at 38
    assert np.abs(mlx_logits - exact).max() < tol
    assert np.abs(torch_logits - exact).max() < tol
    assert np.abs(mlx_logits - torch_logits).max() < 2 * tol
    assert (mlx_logits.argmax(-1) == torch_logits.argmax(-1)).all()


def test_default_model_tokenizer_is_the_mlx_runtimes(default_pair):
    """The torch path tokenizes as the MLX runtime does. transformers' own GGUF tokenizer does
    not split digits off before SmolLM2's byte-level regex, so "?\n\n5" became "\n", "\n" where
    the model's tokenizer (and ours) has one "\n\n" token: a different prompt, another answer."""
    loaded, base = default_pair
    texts = [
        "How would you create a recursive factorial function in Haskell?\n\n5",
        "SELECT name FROM t WHERE year = 2024;\n\n  42 rows",
        "def f(x):\n    return x ** 2  # 3.14\n\n\n1. first\n2. second",
        "Größe: 12 €, naïve café — 東京 2020年",
    ]
    for text in texts:
        assert base.tokenizer.encode(text, add_special_tokens=False) == list(
            loaded.tokenizer.encode(text, add_special_tokens=False)
        ), text
        assert base.encode_chat(text) == encode_prompt(loaded, text), text


@pytest.mark.parametrize("adapter", ["chat", "sql"])  # lossless; shared, LoRA in every block
def test_default_model_with_shipped_adapter_agrees(default_pair, adapter):
    loaded, base = default_pair
    params = load_adapter(adapter, loaded)
    streams = load_torch_adapter(SHIPPED_DIR / adapter, base)
    try:
        # PEFT wraps only the blocks whose LoRA does anything (sql trained every block)
        wrapped = {int(n.split(".layers.")[1].split(".")[0]) for n, _ in base.model.named_modules()
                   if n.endswith(".lora_A")}  # fmt: skip
        n = base.config["num_hidden_layers"]
        assert wrapped == (set(range(n)) if adapter == "sql" else set())
        prompt = encode_prompt(
            loaded,
            "Summarize in two sentences: The Eiffel Tower is a wrought-iron lattice tower on "
            "the Champ de Mars in Paris, France. It is named after the engineer Gustave Eiffel, "
            "whose company designed and built the tower from 1887 to 1889.",
        )
        tree = draft_tree(prompt[-1], [[504, 1030], [3575, 28]])
        out, survivors, main, stream = one_tree_step(loaded, params, base, streams, prompt, tree)
        assert survivors == out.survivors
        assert np.abs(np.array(out.main_logits) - main).max() < TOL
        streams_agree(mlx_stream_logits(loaded, params, out), stream)
        m, t = decode_both(loaded, params, base, streams, prompt, 32, lookup=None)
        assert [s.tokens for s in m] == [s.tokens for s in t]
        assert sum(len(s.tokens) for s in t) / len(t) > 1  # drafts were accepted
    finally:
        attach(None, loaded)  # the untouched base: the session's model
        from convert.torch_adapter import remove_lora as remove_torch_lora

        remove_torch_lora(base)


@pytest.mark.parametrize("name", ["chat", "summarize", "sql", "data2text"])
def test_shipped_adapters_round_trip_bit_exactly(name, tmp_path):
    src = af.read_folder(SHIPPED_DIR / name)
    there, _ = af.torch_to_mlx(
        af.read_folder(af.write_folder(tmp_path / "t", af.mlx_to_torch(src)[0]))
    )
    assert there.config == src.config
    assert set(there.tensors) == set(src.tensors)
    for key, value in src.tensors.items():
        assert there.tensors[key].dtype == value.dtype
        assert np.array_equal(there.tensors[key], value), key


@pytest.fixture(scope="module")
def trained(pairs, tmp_path_factory, data):
    """mode -> a PyTorch adapter folder trained a few steps on E2E rows (short enough for the
    tiny model's context)."""
    _, base0 = pairs["llama"]
    root = tmp_path_factory.mktemp("trained")
    e2e = load_dataset(
        data / "e2e" / "train.csv", ChatTokenizer(base0.tokenizer), 4096, "data2text"
    )
    e2e.examples = [e for e in e2e.examples if len(e.ids) <= 200][:8]
    assert len(e2e.examples) == 8, "too few short E2E rows"
    out = {}
    for name in ("lossless", "shared", "shared_top"):  # shared_top: LoRA in the top 2 blocks
        base = load_base(base0.name)
        mode, blocks = ("shared", (2, 3)) if name == "shared_top" else (name, None)
        cfg = StreamConfig(
            gamma=3, top_k=2, n_msa_layers=2, max_tree_nodes=8, mode=mode, lora_blocks=blocks
        )
        torch.manual_seed(0)
        streams = TorchStreams(cfg, base.config["hidden_size"])
        if mode == "shared":
            add_lora(base, cfg)
        rows = train(
            base,
            streams,
            e2e.examples,
            TrainConfig(steps=4, batch_size=2, learning_rate=3e-3, lora_learning_rate=1e-3),
        )
        assert len(rows) == 4 and all(np.isfinite(r["loss"]) for r in rows)
        record = {"training": {"steps": 4, "batch_size": 2}}  # a round's record, as the CLI's
        out[name] = (save_torch_adapter(root / name, streams, base, record), e2e)
    return out


@pytest.mark.parametrize("mode", ["lossless", "shared", "shared_top"])
def test_torch_trained_adapter_converts_and_decodes_identically_in_mlx(
    trained, pairs, mode, tmp_path, capsys
):
    folder, data = trained[mode]
    loaded, _ = pairs["llama"]
    mlx_folder = tmp_path / "mlx"
    assert (
        cli(
            ["convert", "--from", str(folder), "--to", str(mlx_folder), "--model", str(loaded.path)]
        )
        == 0
    )
    assert "torch -> mlx" in capsys.readouterr().out
    if mode == "shared_top":  # trained with LoRA in blocks 2 and 3: only they are stored
        config = json.loads((mlx_folder / "adapter_config.json").read_text())
        assert config["stream_config"]["lora_blocks"] == [2, 3]
        lora = {k.split(".layers.")[1].split(".")[0] for k in config["shapes"] if "lora" in k}
        assert lora == {"2", "3"}
    base = load_base(str(loaded.path))
    streams = load_torch_adapter(folder, base)
    params = load_adapter(mlx_folder, loaded)
    try:
        prompt = data.examples[0].ids[: data.examples[0].loss_mask.index(True)]
        m, t = decode_both(loaded, params, base, streams, prompt, 24)
        assert [s.tokens for s in m] == [s.tokens for s in t]
        if mode != "lossless":  # a PEFT folder: transformers + peft load it as they are
            from peft import PeftModel

            plain = load_base(str(loaded.path))
            peft_model = PeftModel.from_pretrained(plain.model, str(folder))
            ids = prompt[:30]
            with torch.inference_mode():
                theirs = peft_model(torch.tensor([ids])).logits[0].numpy()
            ours = np.array(loaded.model(mx.array(ids)[None])[0])  # the MLX LoRA model
            assert np.abs(theirs - ours).max() < TOL
    finally:
        remove_lora(loaded.model)
    # and back: torch -> MLX -> torch is bit-exact
    back = tmp_path / "back"
    assert cli(["convert", "--from", str(mlx_folder), "--to", str(back), "--no-check"]) == 0
    a, b = af.read_folder(folder), af.read_folder(back)
    assert a.config == b.config and a.peft_config == b.peft_config
    for mine, theirs in ((a.tensors, b.tensors), (a.lora, b.lora)):
        assert set(mine) == set(theirs)
        for key in mine:
            assert mine[key].dtype == theirs[key].dtype
            assert np.array_equal(mine[key], theirs[key]), key


def test_shared_lora_is_merged_for_decoding_and_removed_exactly(trained, pairs):
    """A shared adapter's LoRA is folded into the weights for decoding (as the MLX runtime
    fuses it): the logits of PEFT's unmerged LoRA, without its two extra kernels per
    projection; taking it off gives back the weights as loaded, bit for bit."""
    from peft import PeftModel

    from convert.torch_adapter import _lora_layers
    from convert.torch_adapter import remove_lora as remove_torch_lora

    folder, _ = trained["shared"]
    loaded, _ = pairs["llama"]
    base = load_base(str(loaded.path))
    as_loaded = {k: v.clone() for k, v in base.model.state_dict().items()}
    ids = torch.tensor([[5, 9, 5, 9, 5, 7, 11, 3]])
    load_torch_adapter(folder, base)
    layers = _lora_layers(base.model)
    assert layers and all(layer.merged for _, layer in layers)
    unmerged = PeftModel.from_pretrained(load_base(str(loaded.path)).model, str(folder))
    with torch.inference_mode():
        merged_logits, theirs = base.model(ids).logits, unmerged(ids).logits
    assert (merged_logits - theirs).abs().max() < TOL
    remove_torch_lora(base)
    after = base.model.state_dict()
    assert set(after) == set(as_loaded)
    assert all(torch.equal(after[k], as_loaded[k]) for k in as_loaded)


def test_float16_and_bfloat16_tensors(trained, tmp_path):
    folder, _ = trained["lossless"]
    half = tmp_path / "half"
    shutil.copytree(folder, half)
    tensors = load_file(str(half / af.TORCH_STREAMS))
    save_file({k: v.astype(np.float16) for k, v in tensors.items()}, str(half / af.TORCH_STREAMS))
    there = af.torch_to_mlx(af.read_folder(half))[0]
    back = af.mlx_to_torch(there)[0]
    for key, value in af.read_folder(half).tensors.items():
        assert back.tensors[key].dtype == np.float16 and np.array_equal(back.tensors[key], value)
    bf16 = tmp_path / "bf16"
    shutil.copytree(folder, bf16)
    as_bf16 = {k: torch.from_numpy(v).to(torch.bfloat16) for k, v in tensors.items()}
    from safetensors.torch import save_file as save_torch

    save_torch(as_bf16, str(bf16 / af.TORCH_STREAMS))
    widened = af.read_folder(bf16).tensors
    for key, value in as_bf16.items():  # widened to float32 exactly
        assert np.array_equal(widened[key], value.float().numpy())


def test_convert_stores_lora_as_float16(trained, pairs, tmp_path, capsys):
    """`--lora-dtype float16` stores a shared adapter's LoRA at half the bytes, the streams as
    they were; both runtimes widen it on loading and decode the same tokens from it."""
    folder, data = trained["shared"]
    loaded, _ = pairs["llama"]
    full, half = tmp_path / "full", tmp_path / "half"
    model = ["--model", str(loaded.path)]
    assert run_convert(folder, full, *model) == 0
    assert run_convert(folder, half, *model, "--lora-dtype", "float16") == 0
    lora = assert_only_these_halved(full, half, af.MLX_LORA_PREFIX)
    params = load_adapter(half, loaded)
    base = load_base(str(loaded.path))
    streams = load_torch_adapter(half, base)  # the PyTorch path reads the MLX folder too
    try:
        prompt = data.examples[0].ids[: data.examples[0].loss_mask.index(True)]
        m, t = decode_both(loaded, params, base, streams, prompt, 24)
        assert [s.tokens for s in m] == [s.tokens for s in t]
    finally:
        remove_lora(loaded.model)
    too_big = af.read_folder(full)
    too_big.tensors[sorted(lora)[0]] = too_big.tensors[sorted(lora)[0]] * 0 + 1e6
    with pytest.raises(ss.SpecstreamError, match="beyond float16's range"):
        af.lora_as(too_big, "float16")


def test_convert_stores_parent_heads_as_float16(pairs, tmp_path, capsys):
    """`--heads-dtype float16` stores the streams' parent heads at half their bytes and every
    other tensor as it was; both runtimes widen them on loading, decode alike, and the lossless
    decoder still gives plain greedy decoding's tokens. Out of float16's range: refused."""
    loaded, base = pairs["llama"]
    config = dict(gamma=3, top_k=2, n_msa_layers=2, max_tree_nodes=6, parent_rank=4)
    folder, _ = mlx_adapter(loaded, tmp_path / "a", "lossless", seed=3, **config)
    model = ["--model", str(loaded.path)]
    half = tmp_path / "half"
    assert run_convert(folder, tmp_path / "torch", *model) == 0
    assert run_convert(tmp_path / "torch", half, *model, "--heads-dtype", "float16") == 0
    heads = assert_only_these_halved(Path(folder), half, "parent_heads.")
    params = load_adapter(half, loaded)
    prompt = list(range(30, 40))
    m, t = decode_both(loaded, params, base, load_torch_adapter(half, base), prompt, 24)
    assert [s.tokens for s in m] == [s.tokens for s in t]
    assert [x for s in m for x in s.tokens][:24] == hf_greedy(base.model, prompt, 24)
    too_big = af.read_folder(folder)
    too_big.tensors[sorted(heads)[0]] = too_big.tensors[sorted(heads)[0]] * 0 + 1e6
    with pytest.raises(ss.SpecstreamError, match="parent-head values beyond float16's range"):
        af.heads_as(too_big, "float16")


def assert_only_these_halved(full: Path, half: Path, prefix: str) -> set[str]:
    """The MLX folder `half` holds `full`'s tensors whose names start with `prefix` as float16
    (their values cast exactly) and every other tensor as it was, in a file smaller by about
    half their bytes. Returns those names."""
    a, b = af.read_folder(full).tensors, af.read_folder(half).tensors
    names = {k for k in a if k.startswith(prefix)}
    assert names and set(a) == set(b)
    for key in a:
        want = a[key].astype(np.float16) if key in names else a[key]
        assert b[key].dtype == want.dtype and np.array_equal(b[key], want), key
    halved = sum(a[k].nbytes for k in names) // 2
    size = (half / af.MLX_WEIGHTS).stat().st_size
    assert size < (full / af.MLX_WEIGHTS).stat().st_size - halved + 4096
    return names


def test_convert_carries_acceptance_and_card_both_ways(pairs, tmp_path, capsys):
    """An adapter's acceptance.json (from which the MLX runtime plans its tree) and README.md
    (its card: the training data's licences) travel byte for byte MLX -> torch -> MLX, and the
    runtime reads the statistics from the converted folder; an acceptance.json that does not
    fit the streams is refused before anything is written."""
    from specstream_mlx.streams.acceptance import Acceptance
    from specstream_mlx.streams.adapter_io import read_adapter

    loaded, _ = pairs["llama"]
    folder, _ = mlx_adapter(loaded, tmp_path / "a", "lossless", seed=5, gamma=2, top_k=2,
                            n_msa_layers=2, max_tree_nodes=4)  # fmt: skip
    stats = Acceptance.from_ranks([[0, 1], [2, 8], [0, 0]], 2, "a test")
    (Path(folder) / "acceptance.json").write_text(json.dumps(stats.to_dict()))
    (Path(folder) / "README.md").write_text("# a\nTrained on data under CC BY-SA 3.0.\n")
    model = ["--model", str(loaded.path)]
    assert run_convert(folder, tmp_path / "torch", *model) == 0
    assert run_convert(tmp_path / "torch", tmp_path / "back", *model) == 0
    out = capsys.readouterr().out
    assert out.count("README.md carried") == 2 and out.count("acceptance.json carried") == 2
    for name in ("acceptance.json", "README.md"):
        want = (Path(folder) / name).read_bytes()
        assert (tmp_path / "torch" / name).read_bytes() == want
        assert (tmp_path / "back" / name).read_bytes() == want
    assert read_adapter(tmp_path / "back", loaded).streams.acceptance.counts == stats.counts
    wrong = Acceptance.from_ranks([[0, 1, 0]], 3, "three streams")
    (tmp_path / "torch" / "acceptance.json").write_text(json.dumps(wrong.to_dict()))
    assert run_convert(tmp_path / "torch", tmp_path / "refused", *model) == 2
    assert "counts 3 streams; the adapter has 2" in capsys.readouterr().err
    assert not (tmp_path / "refused").exists()
    (tmp_path / "a_file").write_text("x")
    assert run_convert(folder, tmp_path / "a_file" / "out", *model) == 2
    assert f"{tmp_path / 'a_file'} is not a folder" in capsys.readouterr().err


def run_convert(source, target, *extra):
    return cli(["convert", "--from", str(source), "--to", str(target), *extra])


def test_convert_names_the_base_it_checked(trained, pairs, tmp_path):
    """An adapter trained on a GPU machine records the trainer's path to the model's file
    (runs/cuda/model.gguf there); the converted folder names the base it was checked against,
    so a later `convert` of it finds that base without --model."""
    folder, _ = trained["lossless"]
    loaded, _ = pairs["llama"]
    moved = tmp_path / "moved"
    shutil.copytree(folder, moved)
    config = json.loads((moved / af.TORCH_CONFIG).read_text())
    config["base_model"]["name"] = "runs/cuda/model.gguf"  # not here
    (moved / af.TORCH_CONFIG).write_text(json.dumps(config))
    assert run_convert(moved, tmp_path / "mlx", "--model", str(loaded.path)) == 0
    written = json.loads((tmp_path / "mlx" / af.MLX_CONFIG).read_text())
    assert written["base_model"]["name"] == loaded.name
    assert run_convert(tmp_path / "mlx", tmp_path / "back") == 0  # checked, no --model


def test_convert_refuses_another_base(trained, tiny_folders, tmp_path, capsys):
    folder, _ = trained["lossless"]
    assert run_convert(folder, tmp_path / "x", "--model", str(tiny_folders["qwen2"])) == 2
    err = capsys.readouterr().err
    assert "does not fit the target base" in err and "base model_type" in err
    assert not (tmp_path / "x").exists()


def test_convert_never_writes_what_the_runtime_refuses(trained, tiny_folders, tmp_path, capsys):
    folder, _ = trained["lossless"]
    anonymous = tmp_path / "anonymous"
    shutil.copytree(folder, anonymous)
    config = json.loads((anonymous / af.TORCH_CONFIG).read_text())
    del config["base_model"]  # no fingerprint: the MLX runtime refuses such a folder
    (anonymous / af.TORCH_CONFIG).write_text(json.dumps(config))
    target = tmp_path / "x"
    shutil.copytree(SHIPPED_DIR / "chat", target)  # a good folder already there
    assert run_convert(anonymous, target, "--model", str(tiny_folders["llama"]), "--overwrite") == 2
    assert f"{target / af.MLX_CONFIG}: no base_model" in capsys.readouterr().err
    assert af.read_folder(target).config == af.read_folder(SHIPPED_DIR / "chat").config  # kept


def test_convert_lists_every_missing_and_misshapen_tensor(trained, tiny_folders, tmp_path, capsys):
    folder, _ = trained["shared"]
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    streams = load_file(str(bad / af.TORCH_STREAMS))
    del streams["adapters.1.up.weight"]
    streams["prune.down.weight"] = streams["prune.down.weight"][:, :10]
    save_file(streams, str(bad / af.TORCH_STREAMS))
    lora = load_file(str(bad / af.PEFT_WEIGHTS))
    del lora["base_model.model.model.layers.2.mlp.up_proj.lora_A.weight"]
    save_file(lora, str(bad / af.PEFT_WEIGHTS))
    assert run_convert(bad, tmp_path / "x", "--model", str(tiny_folders["llama"])) == 2
    err = capsys.readouterr().err
    assert "missing tensor adapters.1.b [8, 64]" in err
    assert "missing tensor lora.model.layers.2.mlp.up_proj.lora_a [64, 8]" in err
    assert "prune.a (from prune.down.weight): shape [10, 8], expected [64, 8]" in err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "change, message",
    [
        ({"target_modules": ["q_proj", "v_proj", "lm_head"]}, "unknown PEFT target modules"),
        ({"target_modules": ["q_proj", "v_proj"]}, "lacks"),
        ({"use_dora": True}, "use_dora"),
        ({"lora_alpha": 8}, "disagree with the stream config"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
        ({"target_modules": None}, "target_modules is missing"),
        ({"target_modules": 5}, "target_modules must be a list of module names, got 5"),
        ({"layers_to_transform": [0]}, "disagrees with the stream config's lora_blocks"),
        ({"layers_to_transform": 0}, "disagrees with the stream config's lora_blocks"),
    ],
)
def test_convert_refuses_peft_settings_mlx_cannot_run(trained, tmp_path, capsys, change, message):
    folder, _ = trained["shared"]
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    config = json.loads((bad / af.PEFT_CONFIG).read_text())
    (bad / af.PEFT_CONFIG).write_text(json.dumps({**config, **change}))
    assert run_convert(bad, tmp_path / "x", "--no-check") == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_convert_bad_folders(tmp_path, capsys):
    assert run_convert(tmp_path / "nowhere", tmp_path / "x") == 2
    assert "not found" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert run_convert(tmp_path / "empty", tmp_path / "x") == 2
    assert "neither a PyTorch adapter folder" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    assert run_convert(SHIPPED_DIR / "chat", tmp_path / "file", "--overwrite", "--no-check") == 2
    assert "is a file: give a folder" in capsys.readouterr().err
    assert (tmp_path / "file").read_text() == "x"
    broken = tmp_path / "broken"
    shutil.copytree(SHIPPED_DIR / "chat", broken)
    (broken / "adapters.safetensors").write_bytes(b"\x00\x01")
    assert run_convert(broken, tmp_path / "x", "--no-check") == 2
    assert "corrupt or truncated" in capsys.readouterr().err
    torch_side = tmp_path / "torch_side"  # a PyTorch folder: its streams' file gone
    assert run_convert(SHIPPED_DIR / "chat", torch_side, "--no-check") == 0
    capsys.readouterr()
    config = json.loads((torch_side / af.TORCH_CONFIG).read_text())
    config["base_model"]["name"] = 5
    (torch_side / af.TORCH_CONFIG).write_text(json.dumps(config))
    assert run_convert(torch_side, tmp_path / "x") == 2
    assert "base_model's name must be a string" in capsys.readouterr().err
    (torch_side / af.TORCH_STREAMS).unlink()
    assert run_convert(torch_side, tmp_path / "x", "--no-check") == 2
    assert f"needs its streams: {torch_side / af.TORCH_STREAMS}" in capsys.readouterr().err
    diverged = tmp_path / "diverged"  # an MLX folder whose training went to NaN, to torch
    shutil.copytree(SHIPPED_DIR / "chat", diverged)
    weights = load_file(str(diverged / "adapters.safetensors"))
    name = sorted(weights)[0]
    weights[name] = np.full_like(weights[name], np.nan)
    save_file(weights, str(diverged / "adapters.safetensors"))
    assert run_convert(diverged, tmp_path / "x", "--no-check") == 2
    err = capsys.readouterr().err
    assert "NaN or infinite" in err and name in err
    assert not (tmp_path / "x").exists()


def test_the_torch_path_imports_without_mlx():
    """The GPU machines it is for have torch but no MLX: the validator and trainer must import
    there (the first CUDA run found specstream_mlx.sampling importing mlx)."""
    code = (
        "import sys\n"
        "for m in ('mlx', 'mlx.core', 'mlx.nn', 'mlx_lm'): sys.modules[m] = None\n"
        "import convert.validate_cuda, convert.torch_train, convert.torch_adapter\n"
        "import convert.torch_distill\n"
        "print('ok')\n"
    )
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_validate_command_runs_on_the_cpu(trained, pairs, tmp_path, capsys):
    from convert.validate_cuda import main as validate

    folder, _ = trained["lossless"]
    loaded, _ = pairs["llama"]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "SELECT"}\n{"prompt": "count", "category": "b"}\n')
    out = tmp_path / "r.json"
    argv = [
        "--model",
        str(loaded.path),
        "--adapter",
        str(folder),
        "--prompts",
        str(prompts),
        "--max-tokens",
        "8",
        "--device",
        "cpu",
        "--out",
        str(out),
    ]
    assert validate(argv) == 0
    report = json.loads(out.read_text())
    rows = {m["name"]: m for m in report["methods"]}
    assert set(rows) == {"ar", "ss", "ss+pld"}
    assert rows["ss"]["identical_to_ar"] == 1.0 and rows["ss+pld"]["identical_to_ar"] == 1.0
    assert rows["ss"]["samples"] == 2 and set(rows["ss"]["per_category"]) == {"all", "b"}
    assert "| ss |" in capsys.readouterr().out

    shared, _ = trained["shared"]
    assert validate([*argv[:3], str(shared), *argv[4:]]) == 0
    rows = {m["name"]: m for m in json.loads(out.read_text())["methods"]}
    assert set(rows) == {"ar", "ss", "ss+pld", "ss-plain"}  # the exact reference of shared mode
    assert rows["ss"]["identical_to_ar"] == 1.0 and rows["ss-plain"]["identical_to_ar"] is None
    assert validate([*argv, "--temp", "0.8", "--top-k", "5", "--seed", "1"]) == 0
    report = json.loads(out.read_text())
    assert report["config"]["temp"] == 0.8
    assert all(m["identical_to_ar"] is None for m in report["methods"])  # samples: not compared
    # half precision runs (streams follow the base's dtype); not a parity check
    assert validate([*argv[:3], str(shared), *argv[4:], "--dtype", "bfloat16"]) == 0
    assert json.loads(out.read_text())["config"]["precision"] == "bfloat16"


def test_a_given_tree_policy_is_what_the_torch_decoder_drafts(pairs):
    """speculative_decode(policy=...) drafts that tree, not the streams' own: with an oracle's
    drafts a pass accepts at most the policy's depth plus one token."""
    _, base = pairs["llama"]
    cfg = StreamConfig(gamma=3, top_k=1, n_msa_layers=2)
    streams = TorchStreams(cfg, base.config["hidden_size"]).randomize(1)
    prompt = list(range(30, 40))
    truth = hf_greedy(base.model, prompt, 24)

    def oracle(history):
        done = len(history) - len(prompt)
        return [[truth[done + j] if done + j < len(truth) else 0] for j in range(3)]

    for paths, most in (((), 1), (((0,),), 2), (((0,), (0, 0)), 3)):
        policy = TreePolicy.static(paths)
        steps = list(speculative_decode(base.model, streams, prompt, 20, draft_override=oracle,
                                        policy=policy))  # fmt: skip
        assert [t for s in steps for t in s.tokens] == truth[:20]
        assert max(len(s.tokens) for s in steps) == most


def test_validate_sizes_the_tree_from_the_acceptance_statistics(trained, pairs, tmp_path, capsys):
    """--trees N adds ss@N and ss+pld@N: a tree of the N - 1 most probable rank paths of the
    adapter's acceptance.json (without one, every stream's top 3 cut to N), still lossless."""
    from convert.validate_cuda import main as validate
    from specstream_mlx.streams.acceptance import ACCEPTANCE_FILE, Acceptance

    folder, _ = trained["lossless"]
    gamma = json.loads((folder / "stream_config.json").read_text())["stream_config"]["gamma"]
    measured = tmp_path / "measured"
    shutil.copytree(folder, measured)
    ranks = [[0] * gamma] * 6 + [[1] + [0] * (gamma - 1)] * 3 + [[2] * gamma]
    stats = Acceptance.from_ranks(ranks, gamma).to_dict()
    (measured / ACCEPTANCE_FILE).write_text(json.dumps(stats))
    loaded, _ = pairs["llama"]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "SELECT"}\n')
    out = tmp_path / "r.json"
    argv = ["--model", str(loaded.path), "--prompts", str(prompts), "--max-tokens", "8"]
    argv += ["--device", "cpu", "--out", str(out), "--trees", "3,5"]
    for adapter, made in ((measured, "acceptance.json's best paths"), (folder, "pruned")):
        assert validate([*argv, "--adapter", str(adapter)]) == 0
        report = json.loads(out.read_text())
        rows = {m["name"]: m for m in report["methods"]}
        assert set(rows) == {"ar", "ss", "ss+pld", "ss@3", "ss+pld@3", "ss@5", "ss+pld@5"}
        assert all(r["identical_to_ar"] == 1.0 for n, r in rows.items() if n != "ar")
        assert made in report["config"]["trees"]["ss@5"]
    assert report["config"]["trees"]["ss@3"].startswith("3 nodes")
    capsys.readouterr()
    assert validate([*argv[:-1], "4,x", "--adapter", str(folder)]) == 2
    assert "--trees" in capsys.readouterr().err


def test_a_torch_checkpoint_saved_before_a_new_stream_setting_still_resumes():
    """A checkpoint's run identity lacks StreamConfig fields added since it was saved; they ran
    at their defaults, so it is the same run (and a changed setting is still another run)."""
    from convert.torch_train import _with_new_fields

    now = StreamConfig(mode="shared").to_dict()
    then = {k: v for k, v in now.items() if k != "main_reads_streams"}
    assert _with_new_fields((then, {"steps": 3}, [5]), (now, {"steps": 3}, [5])) == (
        now, {"steps": 3}, [5],
    )  # fmt: skip
    other = {**then, "gamma": 2}
    assert _with_new_fields((other, {}, []), (now, {}, []))[0] != now
    assert _with_new_fields(("next-token", {}, []), ("next-token", {}, [])) == (
        "next-token",
        {},
        [],
    )


def test_torch_train_command_resumes_an_interrupted_run(pairs, tmp_path, capsys, data):
    """`python -m convert.torch_train` writes an adapter `specstream convert` accepts; a run cut
    after step 2 resumes from its checkpoint and ends where an uncut run ends, exactly."""
    from convert import torch_train

    loaded, base0 = pairs["llama"]
    e2e = load_dataset(
        data / "e2e" / "train.csv", ChatTokenizer(base0.tokenizer), 4096, "data2text"
    )
    examples = [e for e in e2e.examples if len(e.ids) <= 200][:6]
    assert len(examples) == 6, "too few short E2E rows"
    cfg = StreamConfig(gamma=2, n_msa_layers=2, mode="shared")
    train_cfg = TrainConfig(
        steps=4,
        batch_size=2,
        learning_rate=3e-3,
        lora_learning_rate=1e-3,
        log_every=1,
        checkpoint_every=1,
    )

    logged = []  # each finished run's rows: the steps its loss curve covers

    def run(checkpoint, stop_at=None):
        base = load_base(base0.name)
        torch.manual_seed(0)
        streams = TorchStreams(cfg, base.config["hidden_size"])
        add_lora(base, cfg)

        def log(row):
            if stop_at is not None and row.get("step") == stop_at:
                raise KeyboardInterrupt

        try:
            rows = train(base, streams, examples, train_cfg, log=log, checkpoint=checkpoint)
        except KeyboardInterrupt:
            return None
        logged.append([r["step"] for r in rows])
        lora = {n: p.detach().clone() for n, p in base.model.named_parameters() if "lora_" in n}
        return streams.state_dict(), lora

    uncut = run(tmp_path / "a.pt")
    assert run(tmp_path / "b.pt", stop_at=2) is None
    assert torch.load(tmp_path / "b.pt", weights_only=False)["step"] == 2
    resumed = run(tmp_path / "b.pt")
    for mine, theirs in zip(uncut, resumed, strict=True):
        assert set(mine) == set(theirs)
        assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert logged == [[1, 2, 3, 4], [1, 2, 3, 4]]  # the resumed run keeps the steps before the cut

    out = tmp_path / "adapter"
    argv = [
        "--model",
        str(loaded.path),
        "--data",
        str(data / "e2e" / "train.csv"),
        "--task",
        "data2text",
        "--out",
        str(out),
        "--steps",
        "2",
        "--batch-size",
        "1",
        "--limit",
        "3",
        "--max-length",
        "200",
        "--n-msa-layers",
        "2",
        "--mode",
        "shared",
        "--device",
        "cpu",
    ]
    assert torch_train.main(argv) == 0
    assert not (tmp_path / "adapter.checkpoint.pt").exists()
    assert af.folder_kind(out) == "torch"
    assert run_convert(out, tmp_path / "mlx", "--model", str(loaded.path)) == 0
    record = json.loads((tmp_path / "mlx" / "adapter_config.json").read_text())["training"]
    assert [w["steps"] for w in record["loss_curve"]] == [[1, 1], [2, 2]]  # as MLX's record
    assert torch_train.main(argv) == 2  # the output exists: refused before any training
    assert "output folder exists" in capsys.readouterr().err
    bad = [*argv[:3], str(tmp_path / "missing.csv"), *argv[4:6], "--out", str(tmp_path / "z")]
    assert torch_train.main(bad) == 2
    assert not (tmp_path / "z").exists()
    top = [*argv[:7], str(tmp_path / "top"), *argv[8:], "--lora-layers", "2"]
    assert torch_train.main(top) == 0  # LoRA in the top 2 blocks, as MLX's --lora-layers
    assert json.loads((tmp_path / "top" / "stream_config.json").read_text())["stream_config"][
        "lora_blocks"
    ] == [2, 3]
    low = [*argv[:7], str(tmp_path / "low"), *argv[8:], "--lora-layers", "1"]
    assert torch_train.main(low) == 2  # below the MSA layers
    assert "--lora-layers must be in [2, 4]" in capsys.readouterr().err
    ranked = [*argv[:7], str(tmp_path / "r4"), *argv[8:], "--rank", "4"]
    assert torch_train.main(ranked) == 0  # stream adapters of rank 4, as MLX's train --rank
    gone = "cuda:99" if torch.cuda.is_available() else "cuda"
    for device, message in (("nonsense", "not a torch device"), (gone, f"--device {gone}: ")):
        assert torch_train.main([*argv[:7], str(tmp_path / "d"), *argv[8:-1], device]) == 2
        assert message in capsys.readouterr().err and not (tmp_path / "d").exists()
    config = json.loads((tmp_path / "r4" / "stream_config.json").read_text())["stream_config"]
    assert config["stream_adapter_rank"] == 4
    assert run_convert(tmp_path / "r4", tmp_path / "r4mlx", "--model", str(loaded.path)) == 0
    shapes = json.loads((tmp_path / "r4mlx" / "adapter_config.json").read_text())["shapes"]
    assert shapes["adapters.0.a"][1] == 4


def test_torch_train_continues_an_adapter(pairs, trained, tmp_path, capsys, data):
    """`--init FOLDER` starts from an adapter's streams and LoRA (a PyTorch folder or its MLX
    conversion): at learning rate 0 the run writes them back unchanged, at LoRA rate 0 its LoRA
    (streams trained, LoRA frozen); the new record keeps the continued one's; an adapter of
    other settings is refused before any training."""
    from convert import torch_train

    loaded, _ = pairs["llama"]
    folder, _ = trained["shared"]  # gamma 3, 2 MSA layers, LoRA in every block
    assert run_convert(folder, tmp_path / "mlx", "--model", str(loaded.path)) == 0
    argv = ["--model", str(loaded.path), "--data", str(data / "e2e" / "train.csv"), "--task",
            "data2text", "--steps", "1", "--batch-size", "1", "--limit", "2", "--max-length",
            "200", "--gamma", "3", "--n-msa-layers", "2", "--mode", "shared", "--device", "cpu",
            "--lr", "0", "--lora-lr", "0"]  # fmt: skip
    before = af.read_folder(folder)
    for source in (folder, tmp_path / "mlx"):
        out = tmp_path / f"from_{source.name}"
        assert torch_train.main([*argv, "--init", str(source), "--out", str(out)]) == 0
        after = af.read_folder(out)
        assert set(after.tensors) == set(before.tensors) and set(after.lora) == set(before.lora)
        for mine, theirs in ((after.tensors, before.tensors), (after.lora, before.lora)):
            assert all(np.array_equal(mine[k], theirs[k]) for k in theirs), source
        record = json.loads((out / af.TORCH_CONFIG).read_text())["training"]
        assert record["init"] == str(source)
        assert record["continues"] == before.config["training"]  # the earlier round's record
    frozen = tmp_path / "frozen"  # streams trained, LoRA frozen (`LORA_LR=0` of make_task_adapter)
    lr = argv.index("--lr") + 1
    moving = [*argv[:lr], "3e-3", *argv[lr + 1 :]]
    assert torch_train.main([*moving, "--init", str(folder), "--out", str(frozen)]) == 0
    after = af.read_folder(frozen)
    assert all(np.array_equal(after.lora[k], before.lora[k]) for k in before.lora)
    assert not all(np.array_equal(after.tensors[k], before.tensors[k]) for k in before.tensors)
    fresh = tmp_path / "fresh"
    assert torch_train.main([*argv, "--out", str(fresh)]) == 0  # without --init: LoRA B is 0
    b = next(k for k in before.lora if ".lora_B." in k)
    assert not af.read_folder(fresh).lora[b].any() and before.lora[b].any()
    other = [*argv, "--n-msa-layers", "3", "--init", str(folder), "--out", str(tmp_path / "o")]
    assert torch_train.main(other) == 2
    err = capsys.readouterr().err
    assert "cannot continue" in err and "n_msa_layers" in err and not (tmp_path / "o").exists()


def test_torch_train_starts_streams_on_a_next_token_lora(pairs, trained, tmp_path, capsys, data):
    """`--init` a next-token LoRA folder (`specstream train --mode next-token`, the writing tools'
    same-budget baseline): shared training starts from its LoRA, frozen at LoRA rate 0 (the
    two-stage recipe: the baseline's LoRA, streams trained on it), with streams as initialised;
    a LoRA of another rank or scale, or lossless mode, is refused before any training."""
    from convert import torch_train

    loaded, _ = pairs["llama"]
    rows = tmp_path / "train.csv"  # two short E2E rows (the header, then the rows)
    rows.write_text("".join((data / "e2e" / "train.csv").read_text().splitlines(True)[:3]))
    lora = tmp_path / "next_token"
    common = ["--model", str(loaded.path), "--data", str(rows), "--task", "data2text",
              "--batch-size", "1", "--max-length", "200"]  # fmt: skip
    mlx_train = ["train", "--mode", "next-token", *common, "--val", str(rows)]
    assert cli([*mlx_train, "--steps", "2", "--out", str(lora)]) == 0
    weights = af.read_tensors(lora / af.MLX_WEIGHTS)
    argv = [*common, "--steps", "1", "--gamma", "3", "--n-msa-layers", "2", "--device", "cpu",
            "--lora-lr", "0", "--mode", "shared"]  # fmt: skip
    out, fresh = tmp_path / "two_stage", tmp_path / "fresh"
    assert torch_train.main([*argv, "--lr", "0", "--init", str(lora), "--out", str(fresh)]) == 0
    assert torch_train.main([*argv, "--init", str(lora), "--out", str(out)]) == 0
    for folder in (fresh, out):
        peft = af.read_folder(folder).lora
        assert len(peft) == len(weights)
        for name, value in weights.items():  # mlx-lm's lora_a (in, r) is PEFT's lora_A (r, in)
            m = name.rsplit(".lora_", 1)
            key = f"{af.PEFT_PREFIX}{m[0]}.lora_{m[1].upper()}.weight"
            assert np.array_equal(peft[key], value.T), key
    record = json.loads((out / af.TORCH_CONFIG).read_text())["training"]
    assert record["init"] == str(lora) and record["continues"]["train_config"]["steps"] == 2
    started, trained_streams = af.read_folder(fresh).tensors, af.read_folder(out).tensors
    assert not all(np.array_equal(started[k], trained_streams[k]) for k in started)
    ours = tmp_path / "torch_next_token"  # the same baseline from the PyTorch trainer
    lora_only = [*common, "--steps", "2", "--mode", "next-token", "--device", "cpu"]
    assert torch_train.main([*lora_only, "--lora-lr", "1e-2", "--out", str(ours)]) == 0
    assert "specstream bench --lora" in capsys.readouterr().out
    config = json.loads((ours / af.MLX_CONFIG).read_text())
    assert config["fine_tune_type"] == "lora" and "stream_config" not in config
    mine = ss.load(str(loaded.path), adapter=str(ours))  # the MLX runtime reads it, fused
    peft = tmp_path / "peft"  # and its LoRA on the torch base computes the same logits
    assert torch_train.main([*argv, "--lr", "0", "--init", str(ours), "--out", str(peft)]) == 0
    torch_base = load_base(str(loaded.path))
    load_torch_adapter(peft, torch_base)
    ids = [1, 5, 9, 13, 2, 7]
    with torch.no_grad():
        logits = torch_base.model(torch.tensor([ids])).logits[0].numpy()
    assert np.allclose(np.array(mine.model(mx.array([ids]))[0]), logits, atol=1e-4)
    assert not np.allclose(np.array(ss.load(str(loaded.path)).model(mx.array([ids]))[0]), logits)
    assert torch_train.main([*lora_only, "--init", str(lora), "--out", str(tmp_path / "no")]) == 2
    assert "--init continues a stream adapter" in capsys.readouterr().err
    ranked = tmp_path / "r4"
    assert cli([*mlx_train, "--steps", "1", "--lora-rank", "4", "--out", str(ranked)]) == 0
    (tmp_path / "afile").write_text("x")
    for bad, message in (
        ([*argv, "--init", str(tmp_path / "afile")], "is a file: give an adapter folder"),
        ([*argv, "--init", str(ranked)], "lora rank: adapter has 4, this run 8"),
        ([*argv[:-1], "lossless", "--init", str(lora)], "only --mode shared"),
        ([*argv, "--lora-layers", "2", "--init", str(lora)], "covers the top 4 blocks, this run 2"),
    ):
        assert torch_train.main([*bad, "--out", str(tmp_path / "no")]) == 2
        assert message in capsys.readouterr().err and not (tmp_path / "no").exists()


def test_torch_speculative_sampling_equals_plain_sampling(pairs, trained):
    """The torch decoder samples by the same tree rejection sampling: its first three tokens are
    distributed as plain sampling's under transformers' own forward (exact table), and a seed
    replays them."""
    from convert.torch_streams import probabilities
    from specstream_mlx.sampling import SamplingParams

    from .test_speculative_sampling import chi_square_p

    folder, _ = trained["lossless"]
    _, base = pairs["llama"]
    streams = load_torch_adapter(folder, base)
    prompt, sampling, runs = [5, 9, 5, 9, 5], SamplingParams(0.8, top_k=3), 800
    table = {(): 1.0}
    with torch.inference_mode():
        for _ in range(3):
            grown = {}
            for seq, pr in table.items():
                logits = base.model(torch.tensor([prompt + list(seq)])).logits[0, -1]
                p = probabilities(logits, sampling).double().numpy()
                grown.update({(*seq, int(t)): pr * p[t] for t in np.flatnonzero(p > 0)})
            table = grown
    counts = {}
    for i in range(runs):
        s = SamplingParams(0.8, top_k=3, seed=i)
        steps = speculative_decode(base.model, streams, prompt, 3, sampling=s)
        seq = tuple(t for step in steps for t in step.tokens)
        counts[seq] = counts.get(seq, 0) + 1
    assert set(counts) <= set(table)
    cells = sorted(table)
    observed = np.array([counts.get(c, 0) for c in cells])
    assert chi_square_p(observed, np.array([table[c] for c in cells]) * runs) > 1e-3
    again = SamplingParams(0.8, top_k=3, seed=7)
    one, two = (
        [t for step in speculative_decode(base.model, streams, prompt, 12, sampling=again)
         for t in step.tokens]
        for _ in range(2)
    )  # fmt: skip
    assert one == two


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_torch_distiller_writes_the_mlx_distillers_rows_and_resumes(tiny_folders, family, tmp_path):
    """convert.torch_distill (batched, left-padded `generate`) writes the rows that
    `specstream distill` writes for the same prompts (a control token's text typed in a prompt
    stays text on both sides), and a second run adds only the missing ones."""
    from convert.torch_distill import distill as torch_distill
    from specstream_mlx.training.distill import distill as mlx_distill
    from specstream_mlx.training.instructions import Instruction

    loaded, base = ss.load(str(tiny_folders[family])), load_base(str(tiny_folders[family]))
    prompts = ["a cat", "the cat sat on the mat and looked at the door", "sat", "<|im_end|> typed"]
    items = [Instruction(p, "test", f"c{i}") for i, p in enumerate(prompts)]
    mlx_out, torch_out = tmp_path / "mlx.jsonl", tmp_path / "torch.jsonl"
    mlx_distill(loaded, items, mlx_out, max_tokens=12, batch_size=4, log=lambda _: None)
    first = torch_distill(base, items[:2], torch_out, 12, 2, log=lambda _: None)
    again = torch_distill(base, items, torch_out, 12, 3, log=lambda _: None)
    assert (first.rows, again.rows) == (2, 2)

    def rows(path):
        return {r["prompt"]: r for r in map(json.loads, path.read_text().splitlines())}

    assert len(torch_out.read_text().splitlines()) == 4
    assert rows(torch_out) == rows(mlx_out)


def test_torch_distiller_answers_a_writing_tools_prompts(tiny_folders, data, tmp_path, capsys):
    """`--task TASK --data-file FILE` answers the writing tool's prompts in the seeded order
    `specstream distill --task` draws (the same first `--limit`), each row naming the data set;
    --data-file without --task is an error, not a traceback."""
    from specstream_apps.cli import build_parser
    from specstream_apps.distill_cmd import source_prompts

    from convert.torch_distill import main as distill_main

    train = data / "sql" / "train.jsonl"
    out = tmp_path / "sql_own.jsonl"
    argv = ["--model", str(tiny_folders["llama"]), "--out", str(out), "--max-tokens", "4"]
    argv += ["--device", "cpu", "--task", "sql", "--data-file", str(train), "--seed", "2"]
    assert distill_main([*argv, "--limit", "5"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    mlx_argv = ["distill", "--task", "sql", "--data-file", str(train), "--out", "o.jsonl"]
    mlx_items = source_prompts(build_parser().parse_args([*mlx_argv, "--seed", "2"]))
    assert sorted(r["prompt"] for r in rows) == sorted(it.prompt for it in mlx_items[:5])
    assert {(r["source"], r["category"]) for r in rows} == {("sql train.jsonl", "sql")}
    capsys.readouterr()
    bad = ["--model", str(tiny_folders["llama"]), "--out", str(out), "--instructions", "x.jsonl"]
    assert distill_main([*bad, "--data-file", str(train), "--device", "cpu"]) == 2
    assert "--data-file" in capsys.readouterr().err


def test_torch_distiller_answers_the_chat_mix(tiny_folders, data, tmp_path, capsys):
    """`--chat-mix N` distils the chat suite's kinds of prompts from the train splits, each row
    naming the data set its prompt came from, without DialogSum's non-commercial dialogues
    unless asked for; a bad N or kind is an error, not a traceback."""
    from convert.torch_distill import main as distill_main
    from specstream_mlx.training.chat_prompts import MIX_SOURCES, build_chat_mix

    out = tmp_path / "mix.jsonl"
    argv = ["--model", str(tiny_folders["llama"]), "--data", str(data), "--out", str(out)]
    argv += ["--seed", "3", "--max-tokens", "4", "--device", "cpu", "--chat-mix"]
    mix = build_chat_mix(data, 10, seed=3, split="train")
    permissive = [(c, p) for c, p in mix if c != "dialogue"]
    assert len(permissive) < len(mix)  # the mix has dialogues to leave out
    assert distill_main([*argv, "10", "--limit", "6"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["prompt"]: r["category"] for r in rows} == {p: c for c, p in permissive[:6]}
    assert all(r["source"] == MIX_SOURCES[r["category"]] for r in rows)
    assert distill_main([*argv, "10"]) == 0  # resumes: only the other prompts are answered
    assert len(out.read_text().splitlines()) == len({p for _, p in permissive})
    assert distill_main([*argv, "10", "--mix-kinds", "all"]) == 0  # the dialogues too
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == len({p for _, p in mix})
    assert {r["category"] for r in rows if "CC BY-NC" in r["source"]} == {"dialogue"}
    capsys.readouterr()
    assert distill_main([*argv, "0"]) == 2
    assert "--chat-mix" in capsys.readouterr().err
    assert distill_main([*argv, "10", "--mix-kinds", "dialog"]) == 2
    assert "--mix-kinds" in capsys.readouterr().err


@pytest.mark.parametrize("top", [None, 2])  # LoRA in every block, or in the top 2 alone
def test_fuse_next_token_writes_a_model_with_the_loras_logits(pairs, tmp_path, top):
    """scripts/fuse_next_token.py merges a next-token LoRA folder into its base: the folder it
    writes loads as a model (MLX and PyTorch) with the base+LoRA's logits; it refuses to replace
    a folder without --overwrite."""
    from specstream_mlx.streams.adapter_io import save_lora_adapter
    from specstream_mlx.streams.fingerprint import MERGED_LORA, weights_sha256

    from .test_shared import randomize_lora

    loaded = ss.load(str(pairs["llama"][0].path))
    n = loaded.config["num_hidden_layers"]
    apply_lora(loaded.model, rank=4, scale=2.0)
    randomize_lora(loaded.model, seed=6)
    if top:
        below = [
            (k, mx.zeros(v.shape))
            for k, v in tree_flatten(loaded.model.parameters())
            if ".lora_" in k and lora_block(k) < n - top
        ]
        loaded.model.update(tree_unflatten(below))
    lora = save_lora_adapter(tmp_path / "lora", loaded)
    out = tmp_path / "fused"
    script = Path(__file__).resolve().parent.parent / "scripts" / "fuse_next_token.py"
    run = [sys.executable, str(script), str(lora), str(out), "--model", str(loaded.path)]
    proc = subprocess.run(run, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    ids = mx.array([[1, 5, 9, 13, 2, 7]])
    want = np.array(loaded.model(ids)[0])
    assert not np.allclose(np.array(ss.load(str(loaded.path)).model(ids)[0]), want, atol=1e-4)
    assert np.allclose(np.array(ss.load(str(out)).model(ids)[0]), want, atol=1e-4)
    with torch.no_grad():
        theirs = load_base(str(out)).model(torch.tensor(np.array(ids))).logits[0].numpy()
    assert np.allclose(theirs, want, atol=1e-4)
    merged_from = json.loads((out / "config.json").read_text())[MERGED_LORA]
    assert merged_from == {"adapter": str(lora), "sha256": weights_sha256(lora)}
    again = subprocess.run(run, capture_output=True, text=True)
    assert again.returncode == 1 and "--overwrite" in again.stderr
    assert "Traceback" not in again.stderr
    streams = Path(ss.__file__).parent / "adapters" / "sql"  # checked before any model loads
    wrong = subprocess.run(
        [*run[:2], str(streams), str(tmp_path / "no")], capture_output=True, text=True
    )
    assert wrong.returncode == 1 and "a stream adapter, not a next-token LoRA" in wrong.stderr
    assert not (tmp_path / "no").exists()


def test_load_base_refuses_a_missing_model_or_device_before_loading(tmp_path):
    """A name that is no folder, .gguf, packaged model or hub id fails at once (it used to try
    the hub for a minute); so does a device this torch cannot use."""
    (tmp_path / "a.txt").write_text("not a model")
    for name, message in (
        ("nonsense", "model 'nonsense' not found"),
        (str(tmp_path / "missing"), "not found"),
        (str(tmp_path / "a.txt"), "is not a .gguf file"),
    ):
        with pytest.raises(ss.SpecstreamError, match=message):
            load_base(name)
    with pytest.raises(ss.SpecstreamError, match="not a torch device"):
        load_base(str(tmp_path / "a.txt"), device="gpu0")
