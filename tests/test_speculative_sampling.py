"""Sampling with the speculative decoders stays lossless: the tokens are distributed exactly as
plain sampling's (tree rejection sampling, decoding/rejection.py). Chi-square tests over many
seeded runs with a fixed overall seed, so every run of the suite draws the same numbers."""

import itertools
import math

import mlx.core as mx
import numpy as np
import pytest

import specstream_mlx as ss
from specstream_mlx.decoding.loop import Decoder, prefilled
from specstream_mlx.decoding.rejection import (
    cap_breadth_first,
    draw_candidates,
    rng_for,
    sample,
    verify_sampled,
)
from specstream_mlx.decoding.tree import draft_tree
from specstream_mlx.decoding.tree_step import tree_forward
from specstream_mlx.generate import encode_prompt
from specstream_mlx.models.arch import arch_of
from specstream_mlx.sampling import SamplingParams, probabilities
from specstream_mlx.streams.config import StreamConfig
from specstream_mlx.streams.params import StreamParams
from specstream_mlx.training.data import Dataset, Example
from specstream_mlx.training.trainer import TrainConfig, train

from .conftest import QUIET

P_MIN = 1e-3  # a fixed seed makes every test deterministic; this only sets how strict it is


def chi_square_p(observed: np.ndarray, expected: np.ndarray) -> float:
    """Pearson's test (cells with expected < 5 pooled), p-value by the Wilson-Hilferty
    approximation of the chi-square tail."""
    keep = expected >= 5
    obs, exp = observed[keep], expected[keep]
    if expected[~keep].sum() >= 5:  # the small cells pooled, when that makes a cell
        obs = np.append(obs, observed[~keep].sum())
        exp = np.append(exp, expected[~keep].sum())
    else:  # too little mass to test: it must not hold many samples either
        assert observed[~keep].sum() <= 5 + 3 * math.sqrt(5), "mass where none is expected"
    stat, df = float(((obs - exp) ** 2 / exp).sum()), len(obs) - 1
    assert df >= 2, "too few cells with an expected count >= 5: not a test"
    z = ((stat / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(z / math.sqrt(2))


# --- the algorithm alone, on a synthetic model over 5 tokens -------------------------------

V = 5


class Synthetic:
    """A "model" whose next-token distribution is a fixed random function of the context."""

    def __init__(self, seed: int, peaked: float):
        self.seed, self.peaked, self.cache = seed, peaked, {}

    def __call__(self, context: tuple) -> np.ndarray:
        if context not in self.cache:
            rng = np.random.default_rng([self.seed, *context])
            self.cache[context] = rng.dirichlet(np.full(V, self.peaked))
        return self.cache[context]


def synthetic_run(model, rng, k, depth, cap, drafts_kind, n_tokens=3, verify=verify_sampled):
    context, out = (0,), []
    while len(out) < n_tokens:
        if drafts_kind == "fixed":  # prompt lookup: fixed tokens (a function of the context)
            candidates = [[(sum(context) * 7 + 3 * d + 1) % V] for d in range(depth)]
            drafts = [None] * depth
        else:
            if drafts_kind == "perfect":  # the target itself along the most likely path
                drafts, ctx = [], context
                for _ in range(depth):
                    drafts.append(model(ctx))
                    ctx = (*ctx, int(np.argmax(drafts[-1])))
            else:  # unrelated streams
                drafts = [np.random.default_rng([99, len(out), d]).dirichlet(np.ones(V))
                          for d in range(depth)]  # fmt: skip
            candidates = [draw_candidates(q, k, rng) for q in drafts]
        tree = cap_breadth_first(draft_tree(context[-1], candidates), cap)

        def target(node, tree=tree, context=context):
            tokens = []
            while node > 0:
                tokens.append(tree.tokens[node])
                node = tree.parents[node]
            return model((*context, *tokens[::-1]))

        path, token = verify(tree, target, drafts, rng)
        new = [tree.tokens[n] for n in path[1:]] + [token]
        context, out = (*context, *new), out + new
    return tuple(out[:n_tokens])


@pytest.mark.parametrize(
    "k, depth, cap, drafts_kind, peaked",
    [
        (1, 3, 4, "streams", 0.5),  # a chain, as the shipped adapters draft
        (2, 2, 7, "streams", 0.5),  # a full k=2 tree
        (3, 2, 5, "streams", 1.0),  # cut breadth-first: one parent keeps a prefix
        (2, 2, 7, "perfect", 0.3),  # drafts that are mostly accepted
        (1, 3, 4, "fixed", 0.5),  # fixed tokens (prompt lookup)
    ],
)
def test_tree_rejection_sampling_gives_the_target_distribution(k, depth, cap, drafts_kind, peaked):
    model, rng, n = Synthetic(k * 10 + depth, peaked), rng_for(2026), 12_000
    counts: dict[tuple, int] = {}
    for _ in range(n):
        seq = synthetic_run(model, rng, k, depth, cap, drafts_kind)
        counts[seq] = counts.get(seq, 0) + 1
    sequences = list(itertools.product(range(V), repeat=3))
    exact = np.array([
        model((0,))[a] * model((0, a))[b] * model((0, a, b))[c] for a, b, c in sequences
    ])  # fmt: skip
    observed = np.array([counts.get(s, 0) for s in sequences])
    assert chi_square_p(observed, exact * n) > P_MIN


def test_the_check_catches_a_wrong_rule():
    """The chi-square check has power: drawing the token after rejected candidates from the
    full target instead of the residual (a common mistake) is caught at the same sample size."""
    model, rng, n = Synthetic(12, 0.5), rng_for(2026), 12_000

    def wrong(tree, target, drafts, rng):
        path, token = verify_sampled(tree, target, drafts, rng)
        if any(tree.parents[c] == path[-1] for c in range(1, len(tree))):  # children rejected
            token = sample(target(path[-1]), rng)
        return path, token

    counts: dict[tuple, int] = {}
    for _ in range(n):
        seq = synthetic_run(model, rng, 2, 2, 7, "streams", verify=wrong)
        counts[seq] = counts.get(seq, 0) + 1
    sequences = list(itertools.product(range(V), repeat=3))
    exact = np.array([
        model((0,))[a] * model((0, a))[b] * model((0, a, b))[c] for a, b, c in sequences
    ])  # fmt: skip
    observed = np.array([counts.get(s, 0) for s in sequences])
    assert chi_square_p(observed, exact * n) < P_MIN


def test_candidates_are_distinct_and_follow_q():
    rng = rng_for(0)
    q = np.array([0.5, 0.3, 0.2, 0.0, 0.0])
    firsts = []
    for _ in range(6000):
        c = draw_candidates(q, 3, rng)
        assert len(c) == len(set(c)) == 3 and 3 not in c and 4 not in c
        firsts.append(c[0])
    observed = np.bincount(firsts, minlength=5)
    assert chi_square_p(observed[:3], q[:3] * 6000) > P_MIN
    assert draw_candidates(np.array([0.0, 1.0, 0.0]), 3, rng) == [1]


# --- the decoders on a tiny real model --------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tiny_folders, tmp_path_factory):
    """The tiny llama with no latency curve: prompt lookup drafts whole chains here, whatever
    curve another test of the run measured and cached for the same model (a gate pricing its
    drafts would decide how many it drafts, and on a measured tiny-model curve it drafts none)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECSTREAM_CACHE", str(tmp_path_factory.mktemp("no-curve")))
        loaded = ss.load(str(tiny_folders["llama"]))
        loaded.eos_token_ids = set()  # every run decides all its tokens: fixed-length sequences
        yield loaded


@pytest.fixture(scope="module")
def trained_streams(tiny, tmp_path_factory):
    """Lossless streams trained on the tiny model's own continuations (they accept drafts)."""
    mx.random.seed(0)  # StreamParams draws its initial values from MLX's global random state
    rng = np.random.default_rng(0)
    examples = []
    for i in range(24):
        prompt = [int(t) for t in rng.integers(3, 250, size=6)]
        out = ss.generate(tiny, prompt, max_tokens=40, sampling=SamplingParams(0.7, seed=i))
        ids = prompt + out.token_ids
        examples.append(Example(ids, [False] * len(prompt) + [True] * (len(ids) - len(prompt))))
    cfg = StreamConfig(gamma=2, top_k=2, n_msa_layers=2, max_tree_nodes=4)
    params = StreamParams(cfg.validate(4), tiny.config["hidden_size"])
    train(tiny, params, Dataset(examples[:20], "self"), examples[20:],
          tmp_path_factory.mktemp("t") / "a", TrainConfig(steps=60, batch_size=4,
          learning_rate=3e-3, val_every=60, checkpoint_every=60),
          QUIET)  # fmt: skip
    return params


def untrained_streams(tiny, parent_rank=0):
    cfg = StreamConfig(gamma=2, top_k=2, n_msa_layers=2, max_tree_nodes=4, parent_rank=parent_rank)
    return StreamParams(cfg.validate(4), tiny.config["hidden_size"]).randomize(3)


def plain_distribution(loaded, prompt, sampling, n_tokens):
    """Exact probability of every n-token continuation under plain sampling."""
    table = {(): 1.0}
    for _ in range(n_tokens):
        grown = {}
        for seq, pr in table.items():
            logits = loaded.model(mx.array(prompt + list(seq))[None])[0, -1]
            p = np.array(probabilities(logits, sampling), dtype=np.float64)
            for t in np.flatnonzero(p > 0):
                grown[(*seq, int(t))] = pr * p[t]
        table = grown
    return table


@pytest.mark.parametrize(
    "streams_kind, sampling, decoder, n_tokens",
    [
        ("untrained", SamplingParams(0.7, top_k=4), "ss", 3),
        # streams that read their parent's token (the main stream's greedy one, then the last
        # stream's best): each depth's candidates still come from one fixed distribution
        ("parent", SamplingParams(0.7, top_k=4), "ss", 3),
        ("trained", SamplingParams(0.7, top_k=4), "ss", 3),
        # streams that draft from a vocabulary of their own (every other token that plain
        # sampling can give here): the drafts' distribution is zero elsewhere, and the
        # rejection rule must read that one
        ("vocab", SamplingParams(0.7, top_k=4), "ss", 3),
        ("trained", SamplingParams(1.0, top_p=0.8, top_k=3), "ss", 3),
        ("trained", SamplingParams(1.0, top_k=3), "ss+pld", 3),
        ("trained", SamplingParams(1.0, top_k=3), "pld", 3),  # lookup drafts alone
        # 5 tokens: passes that follow a rearranged (k=2 tree) path's cache compaction
        ("trained", SamplingParams(0.7, top_k=2), "ss", 5),
    ],
)
def test_speculative_sampling_equals_plain_sampling(
    tiny, trained_streams, streams_kind, sampling, decoder, n_tokens
):
    prompt = [5, 9, 5, 9, 5]  # repeats, so ss+pld's lookup drafts too
    runs = 1200
    exact = plain_distribution(tiny, prompt, sampling, n_tokens)
    streams = (
        trained_streams
        if streams_kind == "trained"
        else trained_streams.with_config(
            draft_vocab=tuple(sorted({t for c in exact for t in c})[::2])
        )
        if streams_kind == "vocab"
        else untrained_streams(tiny, 4 if streams_kind == "parent" else 0)
    )
    counts, passes, decided, nodes = {}, 0, 0, 0
    for i in range(runs):
        s = SamplingParams(sampling.temperature, sampling.top_p, sampling.top_k, seed=10_000 + i)
        out = ss.generate(tiny, prompt, max_tokens=n_tokens, sampling=s, decoder=decoder,
                          streams=streams, chat=False)  # fmt: skip
        seq = tuple(out.token_ids)
        assert len(seq) == n_tokens
        counts[seq] = counts.get(seq, 0) + 1
        passes, decided = passes + out.stats.forward_passes, decided + n_tokens
        nodes += out.stats.tree_nodes
    assert set(counts) <= set(exact)  # never a token plain sampling could not give
    cells = sorted(exact)
    observed = np.array([counts.get(c, 0) for c in cells])
    assert chi_square_p(observed, np.array([exact[c] for c in cells]) * runs) > P_MIN
    if decoder == "pld":  # the lookup drafted (its tokens are rarely in this model's top 3)
        assert nodes / passes > 1.5
    elif streams_kind == "trained":
        assert decided / passes > 1.1  # drafts were accepted
    elif streams_kind == "vocab":  # half the tokens are never drafted: fewer accepted (1.07)
        assert decided / passes > 1.02


def test_the_decoder_check_catches_a_wrong_rule(tiny, trained_streams, monkeypatch):
    """The same check on the real decoder at the same sample size has power: the decoder with
    the common mistake (the token after rejected candidates drawn from the full target, not the
    residual) is caught."""
    from specstream_mlx.decoding import host

    def wrong(tree, target, drafts, rng):
        path, token = verify_sampled(tree, target, drafts, rng)
        if any(tree.parents[c] == path[-1] for c in range(1, len(tree))):  # children rejected
            token = sample(target(path[-1]), rng)
        return path, token

    monkeypatch.setattr(host, "verify_sampled", wrong)
    sampling, prompt, n_tokens, runs = SamplingParams(0.7, top_k=4), [5, 9, 5, 9, 5], 3, 1200
    exact = plain_distribution(tiny, prompt, sampling, n_tokens)
    counts = {}
    for i in range(runs):
        s = SamplingParams(sampling.temperature, sampling.top_p, sampling.top_k, seed=10_000 + i)
        out = ss.generate(tiny, prompt, max_tokens=n_tokens, sampling=s, decoder="ss",
                          streams=trained_streams, chat=False)  # fmt: skip
        counts[tuple(out.token_ids)] = counts.get(tuple(out.token_ids), 0) + 1
    cells = sorted(exact)
    observed = np.array([counts.get(c, 0) for c in cells])
    assert chi_square_p(observed, np.array([exact[c] for c in cells]) * runs) < P_MIN


def test_seed_replays_and_greedy_is_unchanged(tiny, trained_streams):
    prompt = encode_prompt(tiny, "seeded")
    a, b, c = (
        ss.generate(
            tiny,
            prompt,
            max_tokens=20,
            decoder="ss",
            streams=trained_streams,
            sampling=SamplingParams(0.8, seed=seed),
        )  # fmt: skip
        for seed in (1, 1, 2)
    )
    assert a.token_ids == b.token_ids and a.stats.forward_passes == b.stats.forward_passes
    assert a.token_ids != c.token_ids
    greedy = ss.generate(tiny, prompt, max_tokens=20, decoder="ss", streams=trained_streams)
    plain = ss.generate(tiny, prompt, max_tokens=20)
    assert greedy.token_ids == plain.token_ids


def test_shared_mode_samples_too(tiny_folders):
    from specstream_mlx.streams.lora import apply_lora, remove_lora

    loaded = ss.load(str(tiny_folders["qwen2"]))
    cfg = StreamConfig(gamma=2, top_k=1, n_msa_layers=2, max_tree_nodes=3, mode="shared")
    loaded.streams = StreamParams(cfg.validate(4), loaded.config["hidden_size"]).randomize(1)
    apply_lora(loaded.model, 8, 20.0)
    try:
        s = SamplingParams(0.9, seed=4)
        plain = ss.generate(loaded, "shared", max_tokens=12, sampling=s)  # one token per pass
        again = ss.generate(loaded, "shared", max_tokens=12, sampling=s)
        spec = ss.generate(loaded, "shared", max_tokens=12, sampling=s, decoder="ss",
                           streams=loaded.streams)  # fmt: skip
        assert plain.token_ids == again.token_ids and plain.stats.forward_passes == 12
        assert len(spec.token_ids) == 12
    finally:
        remove_lora(loaded.model)


def shared_distribution(loaded, prompt, sampling, n_tokens):
    """Exact probability of every n-token continuation under plain sampling of a shared-mode
    model, whose main stream attends to its streams: every decided token runs as plain
    decoding runs it, one pass each with its streams (the prompt as prefilled)."""
    arch = arch_of(loaded.model, loaded.config["model_type"])
    dec = Decoder(loaded.model, arch, loaded.streams)
    table = {(): 1.0}
    for _ in range(n_tokens):
        grown = {}
        for seq, pr in table.items():
            caches = prefilled(dec, prompt).caches
            for root in (prompt[-1], *seq):
                out = tree_forward(arch, loaded.streams, draft_tree(root, []), caches)
            p = np.array(probabilities(out.main_logits[0], sampling), dtype=np.float64)
            for t in np.flatnonzero(p > 0):
                grown[(*seq, int(t))] = pr * p[t]
        table = grown
    return table


@pytest.mark.parametrize("prompt_streams", [False, True])
def test_shared_adapter_sampling_equals_its_plain_sampling(tiny_folders, prompt_streams):
    """A shared-mode adapter (its main stream attends to its streams) samples with `ss` from
    the distribution of its own plain decoding, computed exactly token by token."""
    loaded = ss.load(str(tiny_folders["llama"]))
    loaded.eos_token_ids = set()
    cfg = StreamConfig(
        gamma=2, top_k=2, n_msa_layers=2, max_tree_nodes=4, mode="shared",
        prompt_streams=prompt_streams,
    )  # fmt: skip
    streams = StreamParams(cfg.validate(4), loaded.config["hidden_size"])
    # untrained streams (copies of the main stream) draft what gets accepted at times; random
    # embeddings make them differ from it, so the main stream's attention to them matters
    shape = streams.stream_embeddings.shape
    streams.stream_embeddings = 0.5 * mx.random.normal(shape, key=mx.random.key(5))
    loaded.streams = streams
    sampling, prompt, n_tokens, runs = SamplingParams(0.8, top_k=3), [7, 3, 7, 3, 7], 3, 1200
    exact = shared_distribution(loaded, prompt, sampling, n_tokens)
    counts, passes = {}, 0
    for i in range(runs):
        s = SamplingParams(sampling.temperature, sampling.top_p, sampling.top_k, seed=20_000 + i)
        out = ss.generate(loaded, prompt, max_tokens=n_tokens, sampling=s, decoder="ss",
                          chat=False)  # fmt: skip
        counts[tuple(out.token_ids)] = counts.get(tuple(out.token_ids), 0) + 1
        passes += out.stats.forward_passes
    assert set(counts) <= set(exact)
    cells = sorted(exact)
    observed = np.array([counts.get(c, 0) for c in cells])
    assert chi_square_p(observed, np.array([exact[c] for c in cells]) * runs) > P_MIN
    assert passes < 0.95 * runs * n_tokens  # drafts were accepted
    first = shared_distribution(loaded, prompt, sampling, 1)
    loaded.streams = None  # the streams change what the shared model samples
    assert first != pytest.approx(plain_distribution(loaded, prompt, sampling, 1), abs=1e-3)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--temp", "-1"], "temperature"),
        (["--temp", "0.7", "--top-p", "0"], "top"),
        (["--temp", "0.7", "--top-p", "1.5"], "top"),
        (["--temp", "0.7", "--top-k", "-2"], "top-k"),
        (["--temp", "0.7", "--seed", "-1"], "seed must be in"),
    ],
)
def test_bad_sampling_flags_are_clear_errors(flags, message, capsys):
    from specstream_apps.cli import main

    try:  # argparse rejects some (SystemExit), SamplingParams the rest (exit code 2)
        code = main(["generate", "--decoder", "ss", "--prompt", "hi", *flags])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    assert message in capsys.readouterr().err
