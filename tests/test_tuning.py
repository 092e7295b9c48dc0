"""Hardware tuning: acceptance statistics, tree choice, the latency curve and its cache, the
static sparse trees and compiled passes (both exact against plain greedy decoding)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import mlx.core as mx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specstream_mlx as ss
from specstream_mlx import calibration
from specstream_mlx.decoding.loop import (
    Decoder,
    OnDevice,
    Prefill,
    decode,
    decode_from,
    prefilled,
)
from specstream_mlx.decoding.passes import Passes
from specstream_mlx.decoding.plan import (
    Acceptance,
    best_paths,
    choose_tree,
    choose_walked,
    expected_tokens,
    ranks_of,
    sparse_tree,
)
from specstream_mlx.decoding.policy import TreePolicy
from specstream_mlx.errors import SpecstreamError
from specstream_mlx.generate import encode_prompt
from specstream_mlx.models.arch import arch_of
from specstream_mlx.sampling import SamplingParams
from specstream_mlx.streams.config import StreamConfig
from specstream_mlx.streams.params import StreamParams

from .tiny import FAMILIES, draft_vocab


@pytest.fixture(scope="module")
def tiny_models(tiny_folders):
    return {family: ss.load(str(folder)) for family, folder in tiny_folders.items()}


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSTREAM_CACHE", str(tmp_path / "cache"))


def streams_for(loaded, seed=0, **config):
    cfg = StreamConfig(**config).validate(loaded.config["num_hidden_layers"])
    return StreamParams(cfg, loaded.config["hidden_size"]).randomize(seed)


# ---- acceptance statistics and tree choice (no model) ----


def test_acceptance_counts_rank_paths_and_round_trips():
    ranks = [[0, 1, 0], [0, 0, 9], [2, 0, 0], [9, 0, 0], [0, 1, 3]]
    acc = Acceptance.from_ranks(ranks, gamma=3, source="test")
    assert acc.positions == 5
    # a target outside the counted ranks ends its path: [9, 0, 0] counts nothing
    assert acc.counts == {
        (0,): 3,
        (0, 1): 2,
        (0, 1, 0): 1,
        (0, 1, 3): 1,
        (0, 0): 1,
        (2,): 1,
        (2, 0): 1,
        (2, 0, 0): 1,
    }
    again = Acceptance.from_dict(json.loads(json.dumps(acc.to_dict())))
    assert again.counts == acc.counts and again.positions == 5 and again.gamma == 3
    assert expected_tokens(acc, [(0,), (0, 1)]) == pytest.approx(1 + 3 / 5 + 2 / 5)
    # stream 1 right at 3 of 5; stream 2 right after a right stream 1 at 1 of those 3; stream 3
    # never right after two right ones (the one such row missed). Within top 3: stream 1 at 4
    # of 5, stream 2 at 4 of those 4, stream 3 at 2 of those 4 (ranks 9 and 3 are outside).
    rates = acc.rates()
    assert rates["positions"] == 5 and rates["source"] == "test"
    # each stream alone, whatever the earlier ones did
    assert rates["top1"] == [0.6, 0.6, 0.6] and rates["top3"] == [0.8, 1.0, 0.6]
    assert Acceptance.from_dict(acc.to_dict()).rates() == rates
    older = {k: v for k, v in acc.to_dict().items() if k not in ("top1", "top3")}
    assert Acceptance.from_dict(older).rates()["top1"] is None  # saved before they were kept
    assert rates["top1_given_earlier_right"] == [0.6, round(1 / 3, 4), 0.0]
    assert rates["top3_given_earlier_in_top3"] == [0.8, 1.0, 0.5]


def test_bad_acceptance_file_is_a_clear_error(tmp_path):
    (tmp_path / "acceptance.json").write_text(
        '{"gamma": 2, "positions": 3, "counts": {"0": 2, "0.0": 3}}'
    )  # a child counted more often than its parent
    with pytest.raises(SpecstreamError, match="more often than its parent"):
        Acceptance.read(tmp_path)
    (tmp_path / "acceptance.json").write_text('{"gamma": 2, "positions": 3, "counts": {"0.x": 1}}')
    with pytest.raises(SpecstreamError, match="bad acceptance statistics"):
        Acceptance.read(tmp_path)
    (tmp_path / "acceptance.json").write_text("{}")
    with pytest.raises(SpecstreamError, match="bad acceptance statistics: no 'counts' field"):
        Acceptance.read(tmp_path)
    (tmp_path / "acceptance.json").write_text("[]")
    with pytest.raises(SpecstreamError, match="bad acceptance statistics: not a JSON object"):
        Acceptance.read(tmp_path)
    (tmp_path / "acceptance.json").write_text("{not json")
    with pytest.raises(SpecstreamError, match="unreadable"):
        Acceptance.read(tmp_path)


def test_ranks_of_a_decode():
    history = [5, 6, 7, 8, 9]
    # after 2 tokens, stream 0 targets history[2] = 7, stream 1 history[3] = 8
    probes = [(2, [[7, 1], [1, 8]]), (3, [[1, 2], [9, 3]]), (4, [[9], [0]])]
    assert ranks_of(history, probes) == [[0, 1], [8, 0]]  # the last has no known targets


def test_best_paths_keep_parents():
    acc = Acceptance(2, 100, {(0,): 30, (1,): 10, (0, 0): 20, (1, 0): 9, (2,): 8})
    assert best_paths(acc, 2, 3) == [(0,), (1,), (0, 0)]
    assert best_paths(acc, 1, 10) == [(0,), (1,), (2,)]


def test_choice_follows_the_cost_of_nodes():
    acc = Acceptance(2, 100, {(0,): 60, (1,): 20, (0, 0): 40, (0, 1): 10, (1, 0): 5})
    # extra nodes nearly free: take every path
    cheap = choose_tree(acc, lambda nodes, depth: 10 + 0.01 * nodes, plain_ms=10)
    assert cheap.nodes == 6 and cheap.expected_tokens == pytest.approx(2.35)
    # every node costs as much as a whole plain step: one token per pass is best
    dear = choose_tree(acc, lambda nodes, depth: 10.0 * nodes, plain_ms=10)
    assert dear.paths == () and dear.nodes == 1
    # streams cost (depth) but nodes are cheap: only the first level pays
    shallow = choose_tree(acc, lambda nodes, depth: 10 + 5 * depth + 0.1 * nodes, plain_ms=10)
    assert shallow.depth == 1 and set(shallow.paths) == {(0,), (1,)}
    assert shallow.predicted_speedup == pytest.approx(1.8 / 15.3 * 10)


def test_acceptance_keeps_its_trace_and_splits_by_stream_ones_confidence():
    """With stream 1's confidence at each position the positions are kept in order (a trace)
    and the counts split at its quartiles, the bins adding up to the whole; the trace survives
    the file, and a trace that does not give the file's counts is refused."""
    ranks = [[0, 0], [0, 9], [1, 0], [9, 9]] * 25 + [[0, 0]] * 4
    confidence = [0.9, 0.6, 0.3, 0.05] * 25 + [0.95] * 4
    acc = Acceptance.from_ranks(ranks, 2, "test", confidence, starts=[0, 50, 50, 200])
    assert acc.positions == 104 and len(acc.gates) == 3 and len(acc.bins) == 4
    assert list(acc.gates) == sorted(acc.gates) and acc.trace.starts == (0, 50)
    assert sum(b.positions for b in acc.bins) == 104
    assert acc.bins[-1].counts == {(0,): 29, (0, 0): 29}  # every 0.9 and 0.95: both right
    assert acc.bins[0].counts == {}  # confidence 0.05: ranks 9, nothing counted
    again = Acceptance.from_dict(json.loads(json.dumps(acc.to_dict())))
    assert again.gates == acc.gates and again.trace.starts == (0, 50)
    assert [b.counts for b in again.bins] == [b.counts for b in acc.bins]
    assert again.trace.ranks.tolist() == [[min(r, 8) for r in row] for row in ranks]
    bad = acc.to_dict()
    bad["trace"]["ranks"][0] = "88"  # no longer the counts' first position
    with pytest.raises(SpecstreamError, match="does not give the counts"):
        Acceptance.from_dict(bad)
    bad["trace"]["ranks"][0] = "0x"
    with pytest.raises(SpecstreamError, match="bad acceptance trace"):
        Acceptance.from_dict(bad)
    with pytest.raises(SpecstreamError, match="confidences for"):
        Acceptance.from_ranks(ranks, 2, confidence=confidence[:-1])


def test_walked_trees_draft_deep_where_the_streams_are_sure():
    """99 sure positions (both streams right, confidence 0.9), then 100 unsure ones (never
    right, 0.1). Walked pass by pass, no single tree beats plain decoding; a tree per bin
    drafts a chain where sure (33 passes of 3 tokens, 19 ms) and the root alone where not (100
    passes of 1 token, 11 ms: the streams run for the next draft), and says so per bin."""
    ranks = [[0, 0]] * 99 + [[9, 9]] * 100
    acc = Acceptance.from_ranks(ranks, 2, confidence=[0.9] * 99 + [0.1] * 100)

    def pass_ms(nodes, depth):
        return 10 + 0.5 * depth + 4 * (nodes - 1)

    plan = choose_walked(acc, pass_ms, plain_ms=10)
    assert plan.gates == (0.9,) and plan.bins == ((), ((0,), (0, 0)))
    assert plan.expected_tokens == pytest.approx(199 / 133)
    assert plan.predicted_speedup == pytest.approx(199 / (33 * 19 + 100 * 11) * 10)
    assert choose_tree(acc, pass_ms, plain_ms=10).paths == ((0,), (0, 0))  # counted, not walked
    assert plan.policy().paths_at(0.95) == ((0,), (0, 0)) and plan.policy().paths_at(0.0) == ()
    assert plan.to_dict()["bin_trees"] == [[], [[0], [0, 0]]]
    # each bin's tokens a pass on the walk (what ss+pld weighs a lookup chain against)
    assert plan.bin_tokens == pytest.approx((1.0, 3.0))
    assert plan.to_dict()["bin_expected_tokens"] == [1.0, 3.0]
    from specstream_apps.calibrate_cmd import describe_tree

    line = describe_tree("sure", plan.to_dict(), drift=0.0)
    assert "the root alone from 0.0" in line and "3 nodes [[0], [0, 0]] from 0.9" in line
    # confidence that tells nothing: one tree for all (here none)
    flat = Acceptance.from_ranks(ranks, 2, confidence=[0.5, 0.4] * 99 + [0.5])
    assert choose_walked(flat, pass_ms, 10).bins == ()
    # too few positions in a bin to trust it: one tree
    few = Acceptance.from_ranks(ranks[:40] + ranks[-40:], 2, confidence=[0.9] * 40 + [0.1] * 40)
    assert choose_walked(few, pass_ms, 10).bins == ()
    # a tree per bin waits for the last pass's confidence: each of its 133 passes costs more
    slower = choose_walked(acc, pass_ms, plain_ms=10, gated_ms=0.5)
    assert slower.bins == plan.bins and slower.pass_ms == pytest.approx((1727 + 66.5) / 133)
    assert choose_walked(acc, pass_ms, plain_ms=10, gated_ms=3.0).paths == ()  # then none pays


def test_the_walk_prices_a_tree_by_the_passes_a_decode_makes():
    """Counted, stream 1 is right at half the positions; walked, a pass that accepts its
    draft skips the next position, so when right and wrong alternate every pass lands on a
    right one: 2 tokens a pass where counting says 1.5."""
    ranks = [[0], [9]] * 50
    acc = Acceptance.from_ranks(ranks, 1, confidence=[0.5] * 100)
    plan = choose_walked(acc, lambda nodes, depth: 10.0 + (nodes - 1), plain_ms=10)
    assert plan.paths == ((0,),) and plan.expected_tokens == pytest.approx(2.0)
    assert choose_tree(acc, lambda nodes, depth: 10.0 + (nodes - 1), 10).expected_tokens == 1.5
    # a static tree's next pass is built while this one runs: nothing more to charge
    ungated = choose_walked(acc, lambda nodes, depth: 10.0 + (nodes - 1), 10, gated_ms=5.0)
    assert ungated.paths == ((0,),) and ungated.pass_ms == pytest.approx(plan.pass_ms)


def test_gated_policy_picks_its_bins_tree():
    policy = TreePolicy.gated((0.2, 0.6), ((), ((0,),), ((0,), (0, 0), (1,))))
    assert policy.depth == 2 and policy.top_k == 2 and policy.max_nodes == 4
    assert policy.paths_at(0.1) == () and policy.paths_at(0.2) == ((0,),)
    assert policy.paths_at(0.99) == ((0,), (0, 0), (1,))
    assert policy.fixed_paths() is None and len(policy.static_trees()) == 3
    assert TreePolicy.gated((0.5,), (((0,),), ((0,),))) == TreePolicy.static(((0,),))
    with pytest.raises(ValueError, match="ascending gates"):
        TreePolicy.gated((0.6, 0.2), ((), (), ()))


def test_sparse_tree_holds_each_paths_token():
    tree = sparse_tree(100, [[1, 2, 3], [4, 5]], [(0,), (2,), (0, 1), (2, 0)])
    assert tree.tokens == [100, 1, 3, 5, 4]
    assert tree.parents == [-1, 0, 0, 1, 2]
    assert tree.depths == [0, 1, 1, 2, 2]
    # nothing drafted yet (first pass): the root alone
    assert sparse_tree(7, [], [(0,), (0, 0)]).tokens == [7]


@pytest.mark.parametrize(
    "tree, fragment",
    [
        (((0, 0),), "not a new rank path"),
        (((0,), (0,)), "new rank path"),
        (((64,),), "rank path"),
        (((0,), (3,)), "below top_k"),
        (((0,), (1,), (0, 0), (0, 1)), "must hold the tree"),
    ],
)
def test_bad_static_tree(tree, fragment):
    with pytest.raises(SpecstreamError, match=fragment):
        StreamConfig(gamma=2, top_k=3, max_tree_nodes=4, tree=tree).validate()


def test_static_tree_is_not_saved_with_an_adapter():
    cfg = StreamConfig(gamma=2, tree=((0,), (0, 0)))
    assert "tree" not in cfg.to_dict()
    assert StreamConfig.from_dict({**cfg.to_dict(), "tree": [[0]]}).tree is None


# ---- exactness of static trees and compiled passes ----

tree_paths = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 2)), max_size=6
)


def valid_tree(raw, gamma, depth):
    """Rank paths from hypothesis' triples: every prefix up to `depth`, parents first."""
    paths = set()
    for triple in raw:
        for j in range(1, min(depth, gamma) + 1):
            paths.add(tuple(triple[:j]))
    return tuple(sorted(paths, key=lambda p: (len(p), p)))


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    family=st.sampled_from(sorted(FAMILIES)),
    gamma=st.integers(1, 3),
    n_msa=st.integers(1, 3),
    raw=tree_paths,
    depth=st.integers(1, 3),
    compiled=st.booleans(),
    lookup=st.booleans(),
    prompt=st.text(min_size=1, max_size=30).filter(str.strip),
    length=st.integers(1, 24),
    seed=st.integers(0, 1000),
    guess=st.booleans(),
    parent=st.sampled_from([0, 4]),
    vocab=st.booleans(),
)
def test_static_trees_and_compiled_passes_equal_plain_greedy(
    tiny_models,
    family,
    gamma,
    n_msa,
    raw,
    depth,
    compiled,
    lookup,
    prompt,
    length,
    seed,
    guess,
    parent,
    vocab,
):
    loaded = tiny_models[family]
    paths = valid_tree(raw, gamma, depth)
    params = streams_for(
        loaded,
        seed,
        gamma=gamma,
        n_msa_layers=n_msa,
        top_k=3,
        next_token_guess=guess,
        parent_rank=parent,
        draft_vocab=draft_vocab(loaded, seed) if vocab else None,
    )
    params = params.with_config(tree=paths, max_tree_nodes=len(paths) + 1)
    params.config.validate(loaded.config["num_hidden_layers"])
    plain = ss.generate(loaded, prompt, max_tokens=length, compile=False)
    decoder = "ss+pld" if lookup else "ss"
    spec = ss.generate(
        loaded, prompt, max_tokens=length, decoder=decoder, streams=params, compile=compiled
    )
    assert spec.token_ids == plain.token_ids
    assert spec.finish_reason == plain.finish_reason


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    family=st.sampled_from(sorted(FAMILIES)),
    gamma=st.integers(1, 3),
    n_msa=st.integers(1, 3),
    raws=st.lists(tree_paths, min_size=4, max_size=4),
    seed=st.integers(0, 1000),
)
def test_gated_trees_equal_plain_greedy(tiny_models, family, gamma, n_msa, raws, seed):
    """A tree per bin of stream 1's confidence (its quartiles on this very decode, so every
    bin is visited), settled on the host and on the device, compiled or not: exactly plain
    greedy decoding's tokens."""
    loaded = tiny_models[family]
    prompt, truth = oracle_truth(loaded, 24)
    params = streams_for(loaded, seed, gamma=gamma, n_msa_layers=n_msa, top_k=3)
    acc = calibration.measure_acceptance(loaded, params, [prompt], 24)
    trees = [valid_tree(raw, gamma, gamma) for raw in raws][: len(acc.gates) + 1]
    policy = TreePolicy.gated(acc.gates, trees)
    arch = arch_of(loaded.model, loaded.config["model_type"])
    for passes in (None, Passes(arch, params, False), Passes(arch, params, True)):
        dec = Decoder(loaded.model, arch, params, policy, passes=passes)
        tokens = [t for s in decode(dec, prompt, 24) for t in s.tokens]
        assert tokens[:24] == truth


@pytest.mark.parametrize("compiled", [None, False, True])
def test_each_bin_drafts_its_own_tree(tiny_models, compiled):
    """Gates that every confidence reaches, or none does: every pass after the first drafts
    the top bin's tree, or the bottom one's, on the host (None) and on the device."""
    loaded = tiny_models["llama"]
    prompt, truth = oracle_truth(loaded, 20)
    arch = arch_of(loaded.model, loaded.config["model_type"])
    params = streams_for(loaded, 5, gamma=2, n_msa_layers=2, top_k=2)
    trees = (((0,),), ((0,), (1,), (0, 0)))
    for gates, nodes in (((-1.0,), 4), ((2.0,), 2)):
        passes = None if compiled is None else Passes(arch, params, compiled)
        dec = Decoder(loaded.model, arch, params, TreePolicy.gated(gates, trees), passes=passes)
        steps = list(decode(dec, prompt, 20))
        assert [t for s in steps for t in s.tokens][:20] == truth
        assert steps[0].tree_nodes == 1 and {s.tree_nodes for s in steps[1:]} == {nodes}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_compiled_plain_decoding_equals_eager(tiny_models, family):
    loaded = tiny_models[family]
    eager = ss.generate(loaded, "compiled steps", max_tokens=40, compile=False)
    compiled = ss.generate(loaded, "compiled steps", max_tokens=40, compile=True)
    assert compiled.token_ids == eager.token_ids


def test_compiled_passes_cross_a_capacity_bucket(tiny_models):
    """Over 256 cached rows the KV buffers grow: the next capacity bucket is traced anew."""
    loaded = tiny_models["llama"]
    saved = set(loaded.eos_token_ids)
    loaded.eos_token_ids.clear()
    try:
        prompt = encode_prompt(loaded, "a long run " * 20)
        params = streams_for(loaded, 3, gamma=2, n_msa_layers=2, top_k=2)
        params = params.with_config(tree=((0,), (1,), (0, 0)), max_tree_nodes=4)
        eager = ss.generate(loaded, prompt, max_tokens=300, compile=False)
        spec = ss.generate(
            loaded, prompt, max_tokens=300, decoder="ss", streams=params, compile=True
        )
        plain = ss.generate(loaded, prompt, max_tokens=300, compile=True)
    finally:
        loaded.eos_token_ids.update(saved)
    assert len(prompt) + 300 > 256
    assert spec.token_ids == eager.token_ids == plain.token_ids
    capacities = {key[-1] for passes in loaded.passes.values() for key in passes._fns}
    assert {256, 512} <= capacities


def later_sibling(t):  # truth at rank 1 of stream 1, rank 0 of stream 2
    return [[(t[0] + 1) % 200, t[0]], [t[1], (t[1] + 1) % 200]]


def second_best(t):  # truth at rank 1 of both streams
    return [[0, t[0]], [0, t[1]]]


@pytest.mark.parametrize(
    "family, paths, proposals",
    [
        # the accepted path skips node 1, so the KV rows move
        ("phi3", ((0,), (1,), (1, 0)), later_sibling),
        # a chain drafted from rank 1: every level accepted
        ("qwen2", ((1,), (1, 1)), second_best),
    ],
)
def test_oracle_on_a_static_tree_accepts_its_path(tiny_models, family, paths, proposals):
    """The true tokens drafted where `paths` expects them: two drafted tokens and the
    correction accepted on every pass, compiled or not, and the output stays exact."""
    loaded = tiny_models[family]
    prompt, truth = oracle_truth(loaded, 30)
    arch = arch_of(loaded.model, loaded.config["model_type"])
    params = streams_for(loaded, 2, gamma=2, n_msa_layers=2, top_k=2)
    params = params.with_config(tree=paths, max_tree_nodes=len(paths) + 1)

    def oracle(history):
        done = len(history) - len(prompt)
        return proposals([truth[done + j] if done + j < len(truth) else 0 for j in range(2)])

    policy = TreePolicy.of(params.config)
    for passes in (None, Passes(arch, params, False), Passes(arch, params, True)):
        dec = Decoder(loaded.model, arch, params, policy, passes=passes, override=oracle)
        steps = list(decode(dec, prompt, 30))
        assert [t for s in steps for t in s.tokens] == truth
        assert [len(s.tokens) for s in steps[1:-1]] == [3] * (len(steps) - 2)


def oracle_truth(loaded, n: int) -> tuple[list[int], list[int]]:
    """A prompt and its first n greedy tokens, EOS ignored (a fixed-length run)."""
    prompt = encode_prompt(loaded, "oracle tree")
    saved = set(loaded.eos_token_ids)
    loaded.eos_token_ids.clear()
    try:
        return prompt, ss.generate(loaded, prompt, max_tokens=n).token_ids
    finally:
        loaded.eos_token_ids.update(saved)


@pytest.mark.parametrize(
    "family, paths, proposals",
    [("phi3", ((0,), (1,), (1, 0)), later_sibling), ("qwen2", ((1,), (1, 1)), second_best)],
)
@pytest.mark.parametrize("compiled", [False, True])
def test_device_acceptance_keeps_the_oracle_path(tiny_models, family, paths, proposals, compiled):
    """Passes settled on the device (acceptance, compaction, the next offset all arrays): with
    the true tokens drafted where `paths` expects them, every pass accepts two drafted tokens
    and the correction, the rows move in the buffers, and the output stays exact."""
    loaded = tiny_models[family]
    prompt, truth = oracle_truth(loaded, 40)
    arch = arch_of(loaded.model, loaded.config["model_type"])
    params = streams_for(loaded, 2, gamma=2, n_msa_layers=2, top_k=2)
    passes = Passes(arch, params, compiled)
    dec = Decoder(loaded.model, arch, params, TreePolicy.static(paths), passes=passes)
    state = prefilled(dec, prompt)
    run = OnDevice(dec, state, SamplingParams())
    decided, lengths = [], []
    while len(decided) < 30:
        if decided:  # the oracle's draft in place of the streams'
            truth_ahead = [truth[len(decided) + j] for j in range(2)]
            state.drafts = mx.array(proposals(truth_ahead), dtype=mx.uint32)
        step = run.settle(run.issue())
        decided += step.tokens
        lengths.append(len(step.tokens))
    assert decided == truth[: len(decided)]
    assert lengths[1:] == [3] * (len(lengths) - 1)
    assert state.bound == len(prompt) - 1 + len(decided) == state.offset.item()


# ---- latency curve, its cache, and the default tree choice ----


def test_latency_curve_is_measured_once_and_cached(tiny_models, tmp_path, monkeypatch):
    monkeypatch.setattr(calibration, "MAX_DRIFT", float("inf"))  # sub-ms passes are noisy
    monkeypatch.setattr(calibration, "MAX_OTHERS_CPU", float("inf"))  # whatever else runs
    loaded = tiny_models["llama"]
    loaded.latency_curve = None
    curve = calibration.latency_curve(loaded)
    path = calibration.curve_path(loaded)
    assert path.is_file() and str(path).startswith(str(tmp_path / "cache"))
    assert curve.rows == list(calibration.CURVE_ROWS)[: len(curve.rows)] and len(curve.rows) >= 2
    assert curve.plain_ms > 0 and curve.head_ms[0] > 0
    # the measured loop shape needs no correction; more nodes never cost less
    ref = curve.msa_ref
    assert [curve.pass_ms(n, 1, ref) for n in curve.loop_nodes] == pytest.approx(curve.loop_ms)
    assert curve.pass_ms(curve.loop_nodes[-1], 1, ref) >= curve.pass_ms(1, 1, ref) > 0
    assert len(curve.loop_ms) == len(curve.loop_nodes) >= 2 and curve.plain_step_ms > 0
    assert json.loads(path.read_text())["key"] == curve.key
    loaded.latency_curve = None
    again = calibration.latency_curve(loaded, measure=False)  # read back, not measured
    assert again == curve
    path.write_text("{torn")
    loaded.latency_curve = None
    assert calibration.latency_curve(loaded, measure=False) is None


def test_a_curve_measured_on_a_busy_machine_is_provisional_until_the_machine_is_idle(
    tiny_models, monkeypatch, capsys
):
    """Measured under load, the curve is used and cached as provisional (with a warning): a
    later run on a machine still busy uses it instead of measuring for another minute, and the
    first run that finds the machine idle measures again."""
    loaded = tiny_models["llama"]
    real = calibration.measure_curve
    # (drift, other programs' CPU share): the one-row pass changed meanwhile; another program
    # kept a core of two busy the whole time (no drift); idle
    loads = iter([(0.8, 0.0), (0.1, 0.5), (0.1, 0.01)])
    measured_now = []

    def measured(loaded):  # the real curve, as if measured under that load
        curve = real(loaded)
        curve.drift, curve.others_cpu = next(loads)
        measured_now.append(curve)
        return curve

    monkeypatch.setattr(calibration, "measure_curve", measured)
    idle = iter([False, True, True])  # what each later run finds
    monkeypatch.setattr(calibration, "machine_idle", lambda: next(idle))
    path = calibration.curve_path(loaded)
    path.unlink(missing_ok=True)
    loaded.latency_curve = None
    busy = calibration.latency_curve(loaded)
    assert not busy.steady and loaded.latency_curve is busy and path.is_file()
    assert "changed by 80% while measuring" in capsys.readouterr().err
    loaded.latency_curve = None
    assert calibration.latency_curve(loaded) == busy  # still busy: the cached one, not measured
    assert len(measured_now) == 1
    loaded.latency_curve = None
    assert calibration.latency_curve(loaded, measure=False) == busy  # a plain decode's read...
    again = calibration.latency_curve(loaded)  # ...then, idle: measured again, still under load
    assert len(measured_now) == 2 and not again.steady
    assert "other programs used 50% of the CPUs" in capsys.readouterr().err
    loaded.latency_curve = None
    steady = calibration.latency_curve(loaded)
    assert len(measured_now) == 3 and steady.steady
    assert calibration.read_curve(loaded) == steady
    loaded.latency_curve = None
    assert calibration.latency_curve(loaded) == steady  # steady: no idleness check, no measuring
    loaded.latency_curve = None


@pytest.mark.skipif(not Path("/proc/stat").is_file(), reason="reads Linux's /proc/stat")
def test_other_programs_cpu_time_is_seen_niced_ones_too():
    def spin(seconds):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    code = "import time\nend = time.time() + 2.5\nwhile time.time() < end: pass"
    shares = {}
    for name, prefix in (("busy", []), ("niced", ["nice", "-n", "19"])):
        neighbour = subprocess.Popen([*prefix, sys.executable, "-c", code])
        time.sleep(0.3)  # started
        share = calibration.others_cpu_share()
        if name == "busy":
            spin(1.5)  # this process's own time is not the others'
        else:
            time.sleep(1.5)  # a niced one is left a core (on one core it would get ~1.5%)
        shares[name] = share()
        neighbour.wait()
    # a program spinning on one core of n is 1/n of the machine (half of a single core it
    # shares with this process); a niced one as well: it slows MLX's CPU backend all the same
    assert shares["busy"] > 0.3 / os.cpu_count(), shares
    assert shares["niced"] > 0.3 / os.cpu_count(), shares


def test_curve_key_depends_on_precision(tiny_folders):
    a = ss.load(str(tiny_folders["llama"]), precision="float32")
    b = ss.load(str(tiny_folders["llama"]), precision="float16")
    assert calibration.curve_key(a) != calibration.curve_key(b)


def test_loops_are_timed_at_two_msa_depths_and_passes_between_them_interpolated(
    tiny_models, monkeypatch
):
    monkeypatch.setattr(calibration, "MSA_REF", 1)
    monkeypatch.setattr(calibration, "MSA_DEEP", 3)  # the tiny models have 4 layers
    monkeypatch.setattr(calibration, "DEEP_NODES", 2)
    monkeypatch.setattr(calibration, "MAX_COST_RATIO", float("inf"))  # every row count timed
    timed, star = [], calibration.star_decoder

    def spy(loaded, arch, nodes, n_msa_layers, compiled):
        timed.append((nodes, n_msa_layers))
        return star(loaded, arch, nodes, n_msa_layers, compiled)

    monkeypatch.setattr(calibration, "star_decoder", spy)
    curve = calibration.measure_curve(tiny_models["llama"], rounds=1, rows=(1, 2, 3))
    # the 2-node star twice in the shallow streams: static, and as a tree per confidence bin
    assert sorted(timed) == [(1, 1), (1, 3), (2, 1), (2, 1), (2, 3), (3, 1)]
    assert (curve.msa_ref, curve.msa_deep) == (1, 3) and curve.loop_nodes == [1, 2, 3]
    ref, deep = curve.loop_ms, curve.loop_deep_ms
    assert len(deep) == 2  # the 3-node tree is timed in the shallow streams only
    # each measured depth needs no correction; a deeper pass never costs less; between: linear
    assert [curve.pass_ms(n, 1, 1) for n in (1, 2, 3)] == pytest.approx(ref)
    assert [curve.pass_ms(n, 1, 3) for n in (1, 2)] == pytest.approx(deep)
    assert all(d >= r for d, r in zip(deep, ref, strict=False))
    assert curve.pass_ms(2, 1, 2) == pytest.approx((ref[1] + deep[1]) / 2)
    # other stream counts move along the curve from the measured pass at that depth
    more = curve._layers_and_head(2, 3, 3, 3) - curve._layers_and_head(2, 1, 3, 1)
    assert curve.pass_ms(2, 3, 3) == pytest.approx(deep[1] + more)
    # without stream rows the depth of the MSA layers costs nothing beyond the bare curve
    assert curve.pass_ms(2, 0, 3, 0) == pytest.approx(curve.pass_ms(2, 0, 1, 0))


def test_gated_ms_is_what_the_gated_loop_costs_beyond_its_static_partner(tiny_models, monkeypatch):
    """The gated decoder drafts the 2-node tree at every confidence, but as a tree per bin (so
    the loop waits for each pass's confidence); gated_ms is its loop's ms over the static
    2-node loop's, never below 0."""
    loaded = tiny_models["llama"]
    arch = arch_of(loaded.model, loaded.config["model_type"])
    gated = calibration.gated_decoder(loaded, arch, 1, True)
    assert gated.policy.bins and gated.policy.paths_at(1.0) == ((0,),)
    monkeypatch.setattr(calibration, "MSA_REF", 1)
    monkeypatch.setattr(calibration, "MSA_DEEP", 3)
    monkeypatch.setattr(calibration, "MAX_COST_RATIO", float("inf"))
    for extra, expected in ((3.5, 3.5), (-2.0, 0.0)):

        def fake_loop_ms(dec, start, steps, extra=extra):
            return 10.0 + (extra if dec.policy.bins else 0.0)

        monkeypatch.setattr(calibration, "loop_ms", fake_loop_ms)
        curve = calibration.measure_curve(loaded, rounds=3, rows=(1, 2, 3))
        assert curve.gated_ms == pytest.approx(expected)


def test_a_rewound_prefill_starts_each_timed_loop_afresh(tmp_path):
    """The curve's loops share one prefill: after a loop that filled the caches past their
    first capacity, each decoder starts where a fresh prefill would (the same capacity and
    rows), and decides the same tokens as decoding the prompt; a decoder whose prefill would
    differ (streams over the prompt), or rotating caches (a sliding window), prefill afresh."""
    from .tiny import save_tiny_model

    loaded = ss.load(str(save_tiny_model(tmp_path / "m", "qwen2", hidden_size=128)))
    arch = arch_of(loaded.model, loaded.config["model_type"])
    plain = Decoder(loaded.model, arch, passes=Passes(arch, None, True))
    prompt = [(7 * i + 3) % loaded.config["vocab_size"] for i in range(40)]
    start = Prefill(plain, prompt)
    fresh = [c.keys.shape[2] for c in prefilled(plain, prompt).caches]
    star = calibration.star_decoder(loaded, arch, 8, 1, True)
    calibration.loop_ms(star, start, 240)  # untrained streams: about a token a pass
    assert min(c.keys.shape[2] for c in start.caches) > max(fresh)  # grown past the first
    # the eager decoder settles passes on the host, moving the caches' offsets (passes settled
    # on the device keep theirs in an array): the decoders after it start from where it left
    eager = Decoder(loaded.model, arch)
    quantized = Decoder(loaded.model, arch, kv_bits=8)  # its own caches, prefilled afresh
    for dec in (eager, star, quantized, plain):
        state = start.state(dec)
        assert (state.caches is start.caches) == (dec is not quantized)
        tokens = [t for step in decode_from(dec, state, 24) for t in step.tokens]
        assert tokens == [t for step in decode(dec, prompt, 24) for t in step.tokens]
    rewound, again = start.state(plain).caches, prefilled(plain, prompt).caches
    assert [c.keys.shape[2] for c in rewound] == fresh
    n = len(prompt) - 1  # the rows the loops left alone hold what a fresh prefill writes
    for a, b in zip(rewound, again, strict=True):
        assert mx.array_equal(a.keys[..., :n, :], b.keys[..., :n, :])
    # a decoder whose prefill differs gets its own (streams run over the prompt), as do
    # caches that keep more than an offset (a sliding window's rotating ones)
    cfg = StreamConfig(mode="shared", gamma=1, n_msa_layers=1, prompt_streams=True)
    params = StreamParams(cfg.validate(loaded.config["num_hidden_layers"]), 128).randomize(0)
    sliding = dict(sliding_window=16, layer_types=["sliding_attention", "full_attention"] * 2)
    rotating = ss.load(str(save_tiny_model(tmp_path / "r", "llama", **sliding)))
    rot = Decoder(rotating.model, arch_of(rotating.model, "llama"))
    for begun, dec in ((start, Decoder(loaded.model, arch, params)), (Prefill(rot, prompt), rot)):
        state = begun.state(dec)
        assert state.caches is not begun.caches
        tokens = [t for step in decode_from(dec, state, 12) for t in step.tokens]
        assert tokens == [t for step in decode(dec, prompt, 12) for t in step.tokens]


def flat_curve(loaded, layer_ms=1.0, per_row=0.0):
    """A made-up latency curve for `loaded`: the tree choice without timing noise."""
    rows = list(calibration.CURVE_ROWS)
    n_layers = loaded.config["num_hidden_layers"]
    cost = [layer_ms + per_row * r for r in rows]
    curve = calibration.LatencyCurve(
        "test", loaded.name, loaded.precision, calibration.curve_key(loaded), n_layers, 128, rows,
        cost, cost,
    )  # fmt: skip
    curve.loop_nodes = list(calibration.LOOP_NODES)
    curve.loop_ms = [curve._layers_and_head(n, 1, curve.msa_ref, 1) for n in curve.loop_nodes]
    curve.plain_step_ms = n_layers * layer_ms + layer_ms
    return curve


def test_acceptance_picks_the_tree_by_default(tiny_models):
    loaded = tiny_models["mistral"]
    loaded.latency_curve = flat_curve(loaded, per_row=0.01)
    params = streams_for(loaded, 8, gamma=2, n_msa_layers=2, top_k=1, max_tree_nodes=2)
    # the streams' top guesses are always right: drafting pays on any device
    params.acceptance = Acceptance(2, 100, {(0,): 100, (0, 0): 100, (1,): 1})
    plain = ss.generate(loaded, "tuned by default", max_tokens=16)
    spec = ss.generate(loaded, "tuned by default", max_tokens=16, decoder="ss", streams=params)
    assert spec.token_ids == plain.token_ids
    tree = spec.stats.to_dict()["tree"]
    assert tree["source"] == "calibrated"
    assert [0] in tree["paths"] and [0, 0] in tree["paths"]
    assert tree["predicted_speedup"] > 2.5  # 3 tokens per pass at nearly the cost of one
    own = ss.generate(
        loaded, "tuned by default", max_tokens=16, decoder="ss", streams=params, tree="adapter"
    )
    assert own.stats.to_dict()["tree"]["source"] == "adapter"
    assert own.token_ids == plain.token_ids


def test_useless_streams_decode_plainly(tiny_models):
    loaded = tiny_models["llama"]
    loaded.latency_curve = flat_curve(loaded, per_row=0.01)
    params = streams_for(loaded, 9, gamma=2, n_msa_layers=2)
    params.acceptance = Acceptance(2, 1000, {})  # never right
    plain = ss.generate(loaded, "no draft pays", max_tokens=12)
    spec = ss.generate(loaded, "no draft pays", max_tokens=12, decoder="ss", streams=params)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.to_dict()["tree"]["nodes"] == 1
    assert spec.stats.forward_passes == plain.stats.forward_passes


def test_sampling_drafts_nothing_where_no_greedy_tree_pays(tiny_models):
    loaded = tiny_models["llama"]
    loaded.latency_curve = flat_curve(loaded, per_row=0.01)
    params = streams_for(loaded, 9, gamma=2, n_msa_layers=2, top_k=2, max_tree_nodes=4)
    sampling = SamplingParams(0.8, seed=3)
    params.acceptance = Acceptance(2, 1000, {})  # never right, greedily
    plain = ss.generate(loaded, "sampled", max_tokens=12, sampling=sampling)
    spec = ss.generate(loaded, "sampled", max_tokens=12, decoder="ss", streams=params,
                       sampling=sampling)  # fmt: skip
    assert spec.token_ids == plain.token_ids and spec.stats.decoder == "ar"
    assert spec.stats.forward_passes == plain.stats.forward_passes
    # where a greedy tree pays, sampling drafts the streams' own tree (the statistics are greedy)
    good = streams_for(loaded, 9, gamma=2, n_msa_layers=2, top_k=2, max_tree_nodes=4)
    good.acceptance = Acceptance(2, 100, {(0,): 100, (0, 0): 100})
    drafted = ss.generate(loaded, "sampled", max_tokens=12, decoder="ss", streams=good,
                          sampling=sampling)  # fmt: skip
    assert drafted.stats.to_dict()["tree"]["source"] == "adapter"


def test_bad_tree_choice_name(tiny_models):
    with pytest.raises(SpecstreamError, match="tree must be one of"):
        ss.generate(tiny_models["llama"], "x", max_tokens=2, decoder="ss", tree="best")


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_measured_acceptance_counts_every_decided_position(tiny_models, family):
    """Every position of the greedy decode counts once (but the last gamma, whose later
    tokens are not known), not one per speculative pass."""
    loaded = tiny_models[family]
    params = streams_for(loaded, 4, gamma=2, n_msa_layers=2, top_k=1, max_tree_nodes=3)
    prompts = ["count me", "and me", "a a a a a a"]
    acc = calibration.measure_acceptance(loaded, params, prompts, max_tokens=12)
    decided = [len(ss.generate(loaded, p, max_tokens=12).token_ids) for p in prompts]
    assert acc.gamma == 2 and acc.positions == sum(max(n - 2, 0) for n in decided)
    assert all(len(p) <= 2 and n <= acc.positions for p, n in acc.counts.items())


# ---- the command ----


def test_calibrate_command(tmp_path, capsys, data):
    from specstream_apps.cli import main

    from specstream_mlx.streams.adapter_io import save_adapter

    from .tiny import save_tiny_model

    # byte tokens: an SQL prompt is ~1000 of them
    model = str(save_tiny_model(tmp_path / "m", "llama", max_position_embeddings=4096))
    loaded = ss.load(model)
    folder = tmp_path / "adapter"
    save_adapter(folder, streams_for(loaded, 1, gamma=2, n_msa_layers=2), loaded)
    assert main(["calibrate", "--model", model, "--adapter", str(folder), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tree"] is None and out["curve"]["rows"][0] == 1
    args = ["calibrate", "--model", model, "--adapter", str(folder), "--measure-acceptance"]
    args += ["--suite", "sql", "--data", str(data / "sql" / "dev.jsonl"), "--limit", "2"]
    assert main([*args, "--max-tokens", "6", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    written = Acceptance.read(folder)
    assert written is not None and written.positions > 0
    umask = os.umask(0)
    os.umask(umask)
    assert (folder / "acceptance.json").stat().st_mode & 0o777 == 0o666 & ~umask  # not private
    assert all(tuple(p) in written.counts for p in out["tree"]["paths"])
    assert out["acceptance"] == written.rates()  # per-stream hit rates, measured on 2 prompts
    # the folder now loads with its statistics
    reloaded = ss.load(model, adapter=str(folder))
    assert reloaded.streams.acceptance.counts == written.counts
    # measured again: the statistics are kept unless --overwrite says otherwise
    before = (folder / "acceptance.json").read_bytes()
    assert main([*args, "--limit", "1", "--max-tokens", "4"]) == 2
    assert "exists: its statistics are what the planner reads" in capsys.readouterr().err
    assert (folder / "acceptance.json").read_bytes() == before
    assert main([*args, "--limit", "1", "--max-tokens", "4", "--overwrite"]) == 0
    assert Acceptance.read(folder).positions < written.positions  # one prompt, 4 tokens
    # the text names what a gated plan's pass costs more, from the curve it used (measured
    # again when the cached one was timed on a busier machine, so read back from the cache)
    gated = calibration.read_curve(reloaded).gated_ms
    assert f"waits for it: {gated:.1f} ms more a pass" in capsys.readouterr().out


def test_calibrate_shows_progress_to_a_person(tmp_path, capsys, data, monkeypatch):
    """On a terminal, measuring the curve and the acceptance statistics show bars (stages,
    prompts); --json stays quiet."""
    from specstream_apps import progress
    from specstream_apps.cli import main

    from specstream_mlx.streams.adapter_io import save_adapter

    from .tiny import save_tiny_model

    model = str(save_tiny_model(tmp_path / "m", "llama", max_position_embeddings=4096))
    folder = tmp_path / "adapter"
    save_adapter(folder, streams_for(ss.load(model), 1, gamma=2, n_msa_layers=2), ss.load(model))
    monkeypatch.setattr(progress, "shows_bar", lambda quiet=False: not quiet)
    args = ["calibrate", "--model", model, "--adapter", str(folder), "--force"]
    args += ["--measure-acceptance", "--limit", "2", "--max-tokens", "4", "--suite", "sql"]
    args += ["--data", str(data / "sql" / "dev.jsonl")]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "calibrate" in err and "stage=" in err and "4/4" in err
    assert "acceptance" in err and "2/2" in err and "positions=" in err
    assert main([*args, "--json", "--overwrite"]) == 0
    assert "stage" not in capsys.readouterr().err


def test_calibrate_checks_acceptance_arguments_before_timing(tmp_path, capsys):
    """A folder adapter names no suite: --measure-acceptance without --suite fails at once, not
    after measuring the latency curve (a minute or more on a real model)."""
    from specstream_apps.cli import main

    from specstream_mlx.streams.adapter_io import save_adapter

    from .tiny import save_tiny_model

    model = str(save_tiny_model(tmp_path / "m", "llama"))
    folder = tmp_path / "adapter"
    save_adapter(folder, streams_for(ss.load(model), 1, gamma=2, n_msa_layers=2), ss.load(model))
    args = ["calibrate", "--model", model, "--adapter", str(folder), "--force"]
    assert main([*args, "--measure-acceptance", "--data", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "needs --suite" in err and "measuring the latency curve" not in err


def test_calibrate_refuses_an_adapter_without_streams_before_timing(tiny_folders, tmp_path, capsys):
    """A next-token LoRA folder has no streams to plan a tree for: said at once, before the
    latency curve is measured."""
    from specstream_apps.cli import main

    from .test_bench import lora_folder

    folder = lora_folder(tiny_folders, tmp_path)
    model = str(tiny_folders["llama"])
    assert main(["calibrate", "--model", model, "--adapter", str(folder), "--force"]) == 2
    err = capsys.readouterr().err
    assert "has no speculative streams" in err and "measuring the latency curve" not in err


def test_calibrate_refuses_acceptance_without_adapter(tiny_folders, capsys):
    from specstream_apps.cli import main

    assert main(["calibrate", "--model", str(tiny_folders["llama"]), "--measure-acceptance"]) == 2
    assert "needs --adapter" in capsys.readouterr().err


def test_training_validation_counts_rank_paths():
    """Stream 1's target is always its best token, stream 2's its third best: the statistics
    the trainer saves say so."""

    from specstream_mlx.training.data import Example
    from specstream_mlx.training.trainer import validate

    ids = list(range(10, 30))
    examples = [Example(ids, [False] * 4 + [True] * 16)]
    vocab = 64

    def logits_of(i, rows):
        out = mx.zeros((len(rows), 2, vocab))
        for r, p in enumerate(rows.tolist()):
            out[r, 0, ids[p + 2]] = 5.0  # stream 1 targets token p + 2
            out[r, 1, 1] = 7.0
            out[r, 1, 2] = 6.0
            out[r, 1, ids[p + 3]] = 5.0  # stream 2: rank 2
        return out

    v = validate(examples, logits_of, gamma=2, top_k=3)
    acc = Acceptance.from_dict(v.acceptance)
    assert acc.positions == v.positions > 0
    assert acc.counts == {(0,): v.positions, (0, 2): v.positions}
    assert v.stream_accuracy == [1.0, 0.0] and v.tau_tree == 3.0


@pytest.mark.parametrize("precision", ["q8", "q4"])
def test_mlx_quantized_bases_stay_lossless(tiny_folders, precision):
    loaded = ss.load(str(tiny_folders["llama"]), precision=precision)
    assert loaded.precision == precision
    assert "QuantizedLinear" in {type(m).__name__ for _, m in loaded.model.named_modules()}
    params = streams_for(loaded, 5, gamma=2, n_msa_layers=2, top_k=2, max_tree_nodes=5)
    for compiled in (False, True):
        plain = ss.generate(loaded, "quantized base", max_tokens=20, compile=compiled)
        spec = ss.generate(
            loaded, "quantized base", max_tokens=20, decoder="ss", streams=params, compile=compiled
        )
        assert spec.token_ids == plain.token_ids


def test_a_shared_adapters_plain_step_counts_its_stream_rows_not_a_head_on_them(tiny_models):
    loaded = tiny_models["llama"]
    curve = flat_curve(loaded, per_row=0.5)
    n_msa, gamma = 2, 3
    extra = curve.shared_plain_ms(gamma, n_msa) - curve.plain_ms
    assert extra == pytest.approx(n_msa * (curve.layer(1 + gamma) - curve.layer(1)))
    # a one-node pass of the same streams also runs the head on their rows: it costs more
    assert curve.shared_plain_ms(gamma, n_msa) < curve.pass_ms(1, gamma, n_msa)


def test_the_plain_step_never_exceeds_the_bare_one_row_pass(tiny_models):
    loaded = tiny_models["llama"]
    curve = calibration.measure_curve(loaded, rounds=1, rows=(1, 2))
    one_row = curve.n_layers * curve.layer(1) + curve.head(1)
    assert 0 < curve.plain_step_ms <= one_row + 1e-3


def test_a_curve_that_drifted_while_measured_asks_a_tree_for_more(tiny_models):
    """A tree predicted a little faster than plain decoding is chosen from a steady curve, and
    not from one whose timings moved more than that gain while it was measured: the prediction
    is no better than them."""
    loaded = tiny_models["llama"]
    curve = flat_curve(loaded, per_row=0.01)
    params = streams_for(loaded, 9, gamma=2, n_msa_layers=2)
    params.acceptance = Acceptance(2, 100, {(0,): 12})  # stream 1 right 12% of the time
    steady = calibration.plan_tree(loaded, params, curve)
    assert steady.paths == ((0,),) and 1.03 < steady.predicted_speedup < 1.12
    assert steady.to_dict()["required_speedup"] == 1.03
    curve.drift = steady.predicted_speedup - 1 + 0.01
    drifted = calibration.plan_tree(loaded, params, curve)
    assert drifted.paths == () and drifted.min_gain == pytest.approx(1 + curve.drift)
    curve.drift = steady.predicted_speedup - 1 - 0.01
    assert calibration.plan_tree(loaded, params, curve).paths == ((0,),)


def test_calibrate_says_why_no_tree_was_chosen():
    from specstream_apps.calibrate_cmd import describe_tree

    tree = {"paths": [], "required_speedup": 1.2, "candidates": [(1, 0, 1.0), (2, 1, 1.04)]}
    line = describe_tree("summarize", tree, drift=0.2)
    assert "no tree pays" in line and "1.04x" in line and "1.2x" in line and "20%" in line
    assert "moved" not in describe_tree("summarize", {**tree, "required_speedup": 1.03}, 0.01)


def test_streams_that_know_the_next_token_are_charged_their_head_pass(tiny_models):
    """The early-exit guess costs a head pass on the drafted nodes: with a head as dear as the
    whole model, acceptance that pays for a tree without the guess no longer pays with it."""
    loaded = tiny_models["llama"]
    curve = flat_curve(loaded, per_row=0.01)
    curve.head_ms = [loaded.config["num_hidden_layers"] * c for c in curve.head_ms]
    acceptance = Acceptance(2, 100, {(0,): 60, (0, 0): 30})
    plans = {}
    for guess in (False, True):
        params = streams_for(loaded, 9, gamma=2, n_msa_layers=2, next_token_guess=guess)
        params.acceptance = acceptance
        plans[guess] = calibration.plan_tree(loaded, params, curve)
    assert plans[False].paths and not plans[True].paths


def test_streams_that_read_their_parent_are_charged_a_head_pass_each(tiny_models):
    """Parent heads run the head once per drafted stream after the main stream's: with a head
    as dear as the whole model, a tree that pays without them no longer does; over a draft
    vocabulary of a tenth of the tokens, those head passes cost a tenth, and it pays again."""
    loaded = tiny_models["llama"]
    curve = flat_curve(loaded, per_row=0.01)
    curve.head_ms = [loaded.config["num_hidden_layers"] * c for c in curve.head_ms]
    acceptance = Acceptance(2, 100, {(0,): 60, (0, 0): 30})
    tenth = tuple(range(0, loaded.config["vocab_size"], 10))
    plans = {}
    for rank, vocab in ((0, None), (4, None), (4, tenth)):
        params = streams_for(
            loaded, 9, gamma=2, n_msa_layers=2, parent_rank=rank, draft_vocab=vocab
        )
        params.acceptance = acceptance
        plans[rank, vocab] = calibration.plan_tree(loaded, params, curve)
    assert plans[0, None].paths and not plans[4, None].paths and plans[4, tenth].paths
