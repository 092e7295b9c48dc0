"""Prompt lookup decoding: drafts copied from the context, verified by the model alone (or by a
shared adapter's model): greedy output equals plain decoding on every family."""

import random

import mlx.core as mx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specstream_mlx as ss
from specstream_mlx.decoding import loop
from specstream_mlx.decoding.lookup import (
    GRAFT,
    LookupConfig,
    LookupCosts,
    LookupGate,
    LookupMemory,
    LookupRates,
    deepest_path,
    graft,
    lookup_draft,
    lookup_drafter,
    lookup_grafter,
    lookup_match,
)
from specstream_mlx.decoding.passes import Passes
from specstream_mlx.decoding.policy import TreePolicy
from specstream_mlx.decoding.tree import Tree, draft_tree
from specstream_mlx.decoding.tree_step import tree_forward
from specstream_mlx.generate import encode_prompt
from specstream_mlx.models.arch import arch_of
from specstream_mlx.sampling import SamplingParams
from specstream_mlx.streams.acceptance import Acceptance

from .test_shared import shared_streams
from .test_speculative import streams_for
from .test_tuning import flat_curve, oracle_truth
from .tiny import FAMILIES

# Prompts of a few repeated words: the lookup finds matches.
WORDS = st.lists(
    st.sampled_from(["the", "cat", "sat", "on", "a", "mat", "."]), min_size=1, max_size=10
)
EXAMPLES = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def tiny_models(tiny_folders):
    return {family: ss.load(str(folder)) for family, folder in tiny_folders.items()}


def test_lookup_draft_takes_the_latest_longest_match():
    # suffix [2, 3] last occurred at 1: the tokens after it
    assert lookup_draft([1, 2, 3, 4, 5, 9, 2, 3]) == [4, 5, 9, 2]
    # the trigram [7, 2, 3] beats the more recent bigram [2, 3]
    assert lookup_draft([7, 2, 3, 8, 2, 3, 6, 7, 2, 3]) == [8, 2, 3, 6]
    # only the unigram matches; the most recent occurrence wins
    assert lookup_draft([3, 1, 3, 4, 0, 3]) == [4, 0, 3]
    assert lookup_draft([1, 2, 3, 4, 5, 9, 2, 3], LookupConfig(max_draft=2)) == [4, 5]
    assert lookup_draft([1, 2, 3]) == []
    assert lookup_draft([5]) == []
    assert lookup_draft([1, 2, 1], LookupConfig(ngram_min=2)) == []


def test_lookup_memory_recalls_every_answer_but_its_own_prompts():
    memory = LookupMemory(size=12)
    memory.add([1, 2], [5, 6, 7])
    memory.add([3], [8, 9])
    assert memory.recall([1, 2]).tolist() == [8, 9, -1]  # its own answer left out
    assert memory.recall([4]).tolist() == [5, 6, 7, -1, 8, 9, -1]
    memory.add([1, 2], [6, 6])  # the same prompt again: its latest answer replaces the first
    assert memory.recall([4]).tolist() == [8, 9, -1, 6, 6, -1]
    memory.add([7], [1] * 6)  # past `size` tokens: the oldest answers go first
    assert memory.recall([4]).tolist() == [6, 6, -1, *[1] * 6, -1]
    memory.add([9], [])  # an empty answer is not kept
    assert len(memory.answers) == 2


def test_lookup_match_takes_an_earlier_answer_where_the_context_has_no_longer_match():
    config = LookupConfig(max_draft=2, recall_draft=3)
    memory = LookupMemory()
    memory.add([0], [4, 5, 6, 7, 8, 9, 4, 5, 1, 2])
    recalled = memory.recall([])
    # a 2-gram in the context wins, drafting max_draft tokens
    assert lookup_match([4, 5, 3, 9, 4, 5], config, recalled) == ([3, 9], 2)
    # none in the context: the latest occurrence of the longest n-gram in the memory, drafting
    # recall_draft tokens, marked by a negative n
    assert lookup_match([3, 8, 9, 4, 5], config, recalled) == ([1, 2], -3)
    assert lookup_match([3, 3, 5, 6], config, recalled) == ([7, 8, 9], -2)
    # the memory's draft ends with its answer; a memory match beats the context's 1-gram
    assert lookup_match([9, 3, 1, 2], config, recalled) == ([], 0)
    assert lookup_match([6, 3, 9, 4, 3], config, recalled) == ([9, 4], 1)
    assert lookup_match([6, 3, 9, 4, 3], config) == ([9, 4], 1)
    assert lookup_match([7, 3, 6, 7], config, recalled) == ([8, 9, 4], -2)
    assert lookup_match([7, 3, 6, 7], config) == ([3, 6], 1)


def _gated_lengths(gate: LookupGate, right: list[bool]) -> list[int]:
    """The chain length the gate picks each pass while the lookup's 4-token proposals are
    right (or wrong from their first token) as `right` says; the text grows by what a pass
    decides."""
    truth = list(range(1000, 1400))
    history, lengths = truth[:10], []
    for ok in right:
        ahead = truth[len(history) : len(history) + 4]
        proposal = ahead if ok else [0, 1, 2, 3]
        n = gate.choose(history, proposal, 3)
        lengths.append(n)
        history = truth[: len(history) + (n if ok else 0) + 1]
    return lengths


def test_the_gate_drafts_while_the_lookup_is_right_and_watches_it_while_it_is_not():
    cheap = LookupCosts((10.0, 12.0, 14.0, 16.0, 18.0))  # each draft adds a fifth of a pass
    lengths = _gated_lengths(LookupGate(cheap), [True] * 8 + [False] * 24 + [True] * 6)
    assert lengths[0] > 0  # before any evidence: the priors pay here
    assert lengths[7] == 4  # right every time: the whole chain
    assert lengths[31] == 0  # wrong every time: plain passes
    # Still scored while not drafted: right proposals bring the chain back within a few passes.
    assert lengths[-1] == 4
    # Chains dearer than what they can decide, or than the pass that runs instead: never.
    dear = LookupCosts((10.0, 30.0, 50.0, 70.0, 90.0))
    assert _gated_lengths(LookupGate(dear), [True] * 10) == [0] * 10
    tree = LookupCosts(cheap.chain_ms, fallback_tokens=3.0, fallback_ms=12.0)
    assert _gated_lengths(LookupGate(tree), [False] * 3 + [True] * 3)[:3] == [0, 0, 0]


def test_the_gate_trusts_what_followed_a_longer_match_more():
    gate = LookupGate(LookupCosts((10.0, 14.0, 16.0, 18.0, 20.0)))
    truth = list(range(1000, 1200))
    for p in range(10, 40):  # 1-gram matches proposing wrong tokens, 3-gram ones right ones
        one = p % 2 == 0
        gate.choose(truth[:p], [0, 1, 2, 3] if one else truth[p : p + 4], 1 if one else 3)
    assert gate.choose(truth[:40], truth[40:44], 3) == 4
    assert gate.choose(truth[:41], truth[41:45], 1) == 0


def _paths(tree: Tree) -> set[tuple[int, ...]]:
    """Every node as the tokens on its path below the root."""
    paths = {0: ()}
    for i in range(1, len(tree)):
        paths[i] = paths[tree.parents[i]] + (tree.tokens[i],)
    return set(paths.values())


def test_a_graft_shares_the_nodes_the_tree_has():
    tree = draft_tree(9, [[1, 2], [3]])  # 9 -> 1 -> 3, 9 -> 2 -> 3
    grown = graft(tree, 0, [1, 3, 4, 5])
    assert grown.tokens[: len(tree)] == tree.tokens  # the tree's nodes keep their places
    assert len(grown) == len(tree) + 2
    assert _paths(grown) == _paths(tree) | {(1, 3, 4), (1, 3, 4, 5)}
    assert grown.parents[len(tree)] == 3 and grown.depths[-2:] == [3, 4]
    # a keep rule that declines the second new node stops the chain there
    cut = graft(tree, 0, [2, 7, 8], keep=lambda k, nodes: k < 1)
    assert _paths(cut) == _paths(tree) | {(2, 7)}
    assert deepest_path(grown) == (len(grown) - 1, [1, 3, 4, 5])
    assert deepest_path(Tree([9], [-1], [0])) == (0, [])


def test_the_grafter_copies_under_the_root_and_past_the_streams_deepest_path():
    # the context ends in [5, 6], which earlier went on [7, 8, 9, 1]; the streams' deepest
    # path is 7, 8, and [6, 7, 8] went on [9, 1, 2, 3] before: the second chain continues the
    # first one where they agree
    history = [4, 5, 6, 7, 8, 9, 1, 2, 3, 0, 5, 6]
    streams = draft_tree(6, [[7, 3], [8]])
    grown = lookup_grafter(GRAFT)(history, streams)[0]
    chain = {(7, 8, 9, 1, 2, 3)[:i] for i in range(3, 7)}
    assert _paths(grown) == _paths(streams) | chain
    assert len(grown) == len(streams) + 4
    # 1-gram matches graft nothing (GRAFT asks for 2-grams); without a match the tree stays
    assert len(lookup_grafter(GRAFT)([1, 2, 3, 1], draft_tree(1, [[4]]))[0]) == 2
    assert lookup_grafter(GRAFT)([4, 5, 6, 0, 5, 6], Tree([6], [-1], [0]))[0].tokens == [6, 0, 5, 6]


def test_the_grafter_keeps_a_node_only_where_it_pays():
    history = [4, 5, 6, 7, 8, 9, 1, 2, 3, 0, 5, 6]
    streams = draft_tree(6, [[3]])  # the streams' guess differs from the lookup's (7)
    # the streams' tree decides 2 tokens a pass: more per ms than the lookup's chain alone
    cheap = LookupCosts(tuple(10.0 + 0.1 * n for n in range(6)), 2.0, 10.0)
    dear = LookupCosts(tuple(10.0 + 10.0 * n for n in range(6)), 2.0, 10.0)
    assert len(lookup_grafter(GRAFT, cheap)(history, streams)[0]) == 2 + 4  # root chain, whole
    assert lookup_grafter(GRAFT, dear)(history, streams)[0].tokens == streams.tokens
    # a node costing a tenth of a pass pays where reached at least as often as the tree
    # without it decides tokens per ms: the gate's priors reach the first copied token half
    # the time and each next one 3/4 as often (0.5, 0.375, ...)
    tenth = LookupCosts(tuple(10.0 + n for n in range(6)), 4.0, 10.0)
    assert lookup_grafter(GRAFT, tenth)(history, streams)[0].tokens == [6, 3, 7]


def test_the_grafter_verifies_the_chain_alone_where_the_streams_tree_decides_less_per_ms():
    history = [4, 5, 6, 7, 8, 9, 1, 2, 3, 0, 5, 6]  # after (5, 6) came 7, 8, 9, 1
    streams = draft_tree(6, [[3], [2]])  # the streams' chain differs from the lookup's
    # a gated tree of lossless streams: 1.1 tokens a pass below stream 1's confidence 0.5, 3.0
    # above it; without the streams a chain pass costs what it does with them (no reason to
    # sit it out)
    chain_ms = tuple(10.0 + n for n in range(10))
    costs = LookupCosts(chain_ms, 2.0, 12.0, (0.5,), (1.1, 3.0), chain_ms)
    grafter = lookup_grafter(GRAFT, costs)
    # unsure streams: the chain alone (1 + 0.5 + 0.375 + 0.28 + 0.21 = 2.37 tokens in 14 ms at
    # the priors) beats their tree with it grafted (1.1 + the same 1.37 in 16 ms)
    assert grafter(history, streams, 0.2)[0].tokens == [6, 7, 8, 9, 1]
    # sure streams: their tree with the chain grafted on (3.0 + 1.37 in 16 ms)
    sure = grafter(history, streams, 0.9)[0]
    assert sure.tokens == [6, 3, 2, 7, 8, 9, 1]
    # a tree whose tokens per pass are not known (its own, not calibrated): never replaced
    unknown = LookupCosts(costs.chain_ms)
    assert lookup_grafter(GRAFT, unknown)(history, streams, 0.2)[0].tokens[:3] == [6, 3, 2]
    # shared streams run in every pass: their tree is kept, the chain grafted on
    shared = LookupCosts(chain_ms, 2.0, 12.0, (0.5,), (1.1, 3.0))
    assert lookup_grafter(GRAFT, shared)(history, streams, 0.2)[0].tokens[:3] == [6, 3, 2]


def test_lossless_streams_sit_out_a_chain_alone_where_their_rows_cost_more_than_the_next_loses():
    chain_ms = tuple(10.0 + n for n in range(6))
    # the streams' calibrated tree: 3 tokens in 12 ms; without the streams a pass verifying 4
    # drafts costs 10.5 ms (14 with them); the pass after, if no chain follows, runs the root
    # alone (10 ms for 1 token, where the tree takes 4 ms a token): 6 ms lost, half the time
    # at the prior
    costs = LookupCosts(chain_ms, 3.0, 12.0, (), (), (7.0, 8.0, 9.0, 10.0, 10.5, 12.0))
    gate, tree = LookupGate(costs), draft_tree(6, [[3], [2]])  # 3 nodes, 1.5 tokens a pass
    assert costs.bare_penalty() == pytest.approx(6.0)
    # the chain alone (2.37 tokens at the priors) in 10.5 + 3 ms beats it in 14 with them
    assert gate.instead([7, 8, 9, 1], 3, tree, 1.5) == (4, False)
    for _ in range(10):  # no chain followed one: the pass after loses 0.88 of 6 ms now
        gate.count_followed(False)
    assert gate.instead([7, 8, 9, 1], 3, tree, 1.5) == (4, True)
    # shared streams run in every pass: the chain alone is not offered
    assert not LookupCosts(chain_ms, 3.0, 12.0).offers_alone() and costs.offers_alone()


def test_the_chain_alone_is_rated_by_how_often_its_first_token_is_right_whatever_was_drafted():
    gate = LookupGate(LookupCosts((10.0, 11.0)))
    assert gate.rates(2, "chain")[0] == 0.5  # the prior
    gate.watch(3, [7, 8], ("chain", 2), first_only=True)
    gate.observe([1, 2, 3, 7, 8])  # its first token right (its second counts toward no rate)
    assert gate.rates(2, "chain") == (pytest.approx(1.5 / 2), pytest.approx(0.75))


def test_a_node_costs_the_mean_step_to_the_largest_pass_not_the_curves_local_step():
    # a curve whose 3rd and 4th sizes were pooled into one level: locally the 4th node is free
    costs = LookupCosts((10.0, 12.0, 20.0, 20.0, 28.0, 30.0), 1.0, 10.0)
    assert costs.node_ms(3) == pytest.approx((30.0 - 20.0) / 3)
    assert costs.node_ms(1) == pytest.approx((30.0 - 10.0) / 5)
    assert costs.node_ms(5) == pytest.approx(2.0)  # the last step, and past it
    assert costs.node_ms(8) == pytest.approx(2.0)
    gate = LookupGate(costs)
    # at 3 nodes a node costs 3.33 ms of a 10 ms pass deciding one token: reached 34% of the
    # time it pays, 30% not (priced at the local step, free, it would pay at any rate)
    assert gate.worth(0.34, 3) and not gate.worth(0.3, 3)


def test_a_chain_past_the_streams_path_also_needs_that_path_right():
    history = [6, 3, 8, 9, 1, 2, 5, 6, 7, 0, 5, 6]
    streams = draft_tree(6, [[3]])  # history + [3] ends in (6, 3): 8, 9, 1, 2 followed it
    costs = LookupCosts(tuple(10.0 + n for n in range(6)), 2.0, 10.0)  # pays if reached >= 0.2
    grown = lookup_grafter(GRAFT, costs)(history, streams)[0]
    # under the root 7, 0, 5, 6 are reached 0.5, 0.375, 0.28, 0.21 of the time (the priors);
    # past the path a chain's first node is reached a quarter of the time (the prior for the
    # path and the node right): 8 at 0.25 pays, 9 at 0.19 not
    assert grown.tokens == [6, 3, 7, 0, 5, 6, 8]
    assert grown.parents[1:] == [0, 0, 2, 3, 4, 1]


def test_the_gate_rates_each_kind_of_chain_by_how_often_the_text_reaches_its_first_new_node():
    costs = LookupCosts((10.0, 11.0))
    gate = LookupGate(costs)
    assert gate.rates(3, "deep")[0] == pytest.approx(0.25)  # the prior: 0.5 right, 1.5 wrong
    # a chain past the streams' path [1, 2]: its first node right, but the path was not
    gate.watch(4, [5, 6], ("deep", 3), after=[1, 2])
    gate.observe([7, 8, 1])  # not settled yet
    assert gate.rates(3, "deep")[0] == pytest.approx(0.25)
    gate.observe([7, 8, 1, 3, 5])  # the path wrong at its second token: the node not reached
    assert gate.rates(3, "deep")[0] == pytest.approx(0.5 / 3)
    assert gate.rates(3)[0] == 0.5  # the other kinds (and n-grams) keep their own rates
    # a chain going on past a draft the streams made too: right where the text took both
    gate.watch(3, [4, 9], ("after-shared", 2), after=[6])
    gate.observe([7, 8, 6, 4, 9])
    assert gate.rates(2, "after-shared")[0] == pytest.approx(1.75 / 3)
    assert gate.rates(2)[1] == pytest.approx(2.5 / 3)  # its second new node: right
    # each count fades by 0.9 when it gains one, not with every pass
    gate.observe([7, 8, 6, 4, 9] + [0] * 20)
    assert gate.rates(2, "after-shared")[0] == pytest.approx(1.75 / 3)


def test_the_grafter_learns_from_earlier_generations_when_given_their_rates():
    # the streams' deepest path is [3]; the text past it does not follow the lookup's chain
    history = [6, 3, 8, 9, 1, 2, 5, 6, 7, 0, 5, 6]
    streams = draft_tree(6, [[3]])
    costs = LookupCosts(tuple(10.0 + n for n in range(6)), 2.0, 10.0)  # pays if reached >= 0.2
    kept = LookupRates()
    grafter = lookup_grafter(GRAFT, costs, kept)
    assert grafter(history, streams)[0].tokens[-1] == 8  # the priors: the deep chain's first node
    grafter(history + [3, 4, 4], streams)  # the text settles it: the path right, then not 8
    assert kept.first[("deep", 2)] == [0.0, 1.0]  # after the 2-gram (6, 3)
    grown = lookup_grafter(GRAFT, costs, kept)(history, streams)[0]  # the next generation
    assert 8 not in grown.tokens  # reached a sixth of the time now: not grafted
    # a fresh gate, without the earlier generations' evidence, grafts it
    assert lookup_grafter(GRAFT, costs)(history, streams)[0].tokens[-1] == 8


@EXAMPLES
@given(
    family=st.sampled_from(sorted(FAMILIES)),
    words=WORDS,
    depth=st.integers(1, 2),
    length=st.integers(1, 20),
    seed=st.integers(0, 1000),
)
def test_grafted_trees_are_verified_and_equal_plain_greedy(
    tiny_models, monkeypatch, family, words, depth, length, seed
):
    """Each pass verifies the streams' static tree with the lookup's chains grafted on (under
    the root and past the deepest path), and the output stays plain decoding's."""
    loaded = tiny_models[family]
    params = streams_for(loaded, seed, gamma=2, top_k=2, n_msa_layers=2, max_tree_nodes=4)
    prompt_ids = encode_prompt(loaded, " ".join(words * 3))
    plain = ss.generate(loaded, prompt_ids, max_tokens=length)
    arch = arch_of(loaded.model, loaded.config["model_type"])
    policy = TreePolicy.static([(0,), (1,), (0, 0)][: 1 + depth])
    dec = loop.Decoder(loaded.model, arch, params, policy)
    grafter = lookup_grafter(GRAFT)
    made = []  # per pass: (history, the streams' tree, the grafted tree)

    def recording(history, tree, _confidence):
        grown, streams = grafter(history, tree)
        made.append((list(history), tree, grown))
        return grown, streams

    trees = []
    forward = loop.tree_forward

    def verified(arch, params, tree, *args, **kwargs):
        trees.append(tree.tokens)
        return forward(arch, params, tree, *args, **kwargs)

    dec.graft = recording
    monkeypatch.setattr(loop, "tree_forward", verified)
    steps = list(loop.decode(dec, prompt_ids, length))
    tokens = [t for s in steps for t in s.tokens]
    cut = next((i + 1 for i, t in enumerate(tokens) if t in loaded.eos_token_ids), len(tokens))
    assert tokens[:cut] == plain.token_ids[:cut]
    assert [grown.tokens for _, _, grown in made] == trees
    for history, tree, grown in made:
        copied = lookup_draft(history, GRAFT)
        _, path = deepest_path(tree)
        further = lookup_draft(history + path, GRAFT) if path else []
        expect = _paths(tree) | {tuple(copied[:i]) for i in range(len(copied) + 1)}
        expect |= {tuple(path + further[:i]) for i in range(len(further) + 1)}
        assert _paths(grown) == expect


@EXAMPLES
@given(
    family=st.sampled_from(sorted(FAMILIES)),
    words=WORDS,
    shared=st.booleans(),
    gated=st.booleans(),
    alone=st.booleans(),
    length=st.integers(1, 20),
    seed=st.integers(0, 1000),
)
def test_grafting_passes_settle_on_the_device_while_nothing_is_grafted(
    tiny_models, monkeypatch, family, words, shared, gated, alone, length, seed
):
    """On KV buffers, a pass the lookup grafts nothing onto settles on the device (Passes.step)
    and one it grafts onto on the host (Passes.logits), the caches and the next draft handed
    over between them: the output stays plain decoding's (a shared model's own, its main
    stream attending to the streams), for static and confidence-gated trees alike, and where
    the gate verifies the lookup's chain alone instead of the streams' tree (`alone`, lossless
    streams: a tree priced at one token a pass, so any chain it expects to be right at all
    beats it, and the streams sit that pass out, the pass after drafting nothing from them)."""
    loaded = tiny_models[family]
    make = shared_streams if shared else streams_for
    params = make(loaded, seed, gamma=2, top_k=2, n_msa_layers=2, max_tree_nodes=4)
    arch = arch_of(loaded.model, loaded.config["model_type"])
    prompt_ids = encode_prompt(loaded, " ".join(words * 3))
    passes = Passes(arch, params, compiled=False)
    plain_dec = loop.Decoder(loaded.model, arch, params, TreePolicy(), passes=passes)
    plain = [t for s in loop.decode(plain_dec, prompt_ids, length) for t in s.tokens]
    tree = [(0,), (1,), (0, 0)]
    policy = TreePolicy.gated((0.5,), ([(0,)], tree)) if gated else TreePolicy.static(tree)
    dec = loop.Decoder(loaded.model, arch, params, policy, passes=passes)
    # lossless streams sit out every chain's pass where verified alone (cheap without them);
    # shared ones keep their tree
    bare = () if shared else tuple(5.0 + n for n in range(6))
    worthless = LookupCosts(tuple(10.0 + n for n in range(6)), 1.0, 11.0, (), (), bare)
    grafter = lookup_grafter(GRAFT, worthless if alone else None)
    grafted = []  # per pass: whether the lookup changed the streams' tree

    def recording(history, tree, confidence):
        grown, streams = grafter(history, tree, confidence)
        grafted.append(grown != tree or not streams)
        return grown, streams

    dec.graft = recording
    ran = _where_passes_run(monkeypatch, passes)
    tokens = [t for s in loop.decode(dec, prompt_ids, length) for t in s.tokens]
    assert tokens == plain
    assert ran == ["host" if g else "device" for g in grafted]


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("gated", [False, True])
def test_grafting_hands_the_oracle_path_between_device_and_host(tiny_models, shared, gated):
    """Compiled passes drafting the true tokens (every pass after the first accepts the tree's
    depth and the correction), a wrong chain grafted every other pass: the passes alternate
    between the device and the host, each taking over the other's caches (the device's last
    accepted rows included) and next draft (with the bin of a gated tree), and the output is
    plain decoding's."""
    loaded = tiny_models["qwen2"]
    prompt, truth = oracle_truth(loaded, 40)
    make = shared_streams if shared else streams_for
    params = make(loaded, 2, gamma=2, top_k=2, n_msa_layers=2, max_tree_nodes=4)
    arch = arch_of(loaded.model, loaded.config["model_type"])
    passes = Passes(arch, params, compiled=True)
    if shared:  # a shared model's plain decoding: its main stream attends to the streams
        plain = loop.Decoder(loaded.model, arch, params, TreePolicy(), passes=passes)
        truth = [t for s in loop.decode(plain, prompt, 40) for t in s.tokens]
    tree = ((0,), (1,), (0, 0))
    # gated: one gate every confidence reaches, so every pass drafts the deeper tree
    policy = TreePolicy.gated((1e-6,), (((0,),), tree)) if gated else TreePolicy.static(tree)
    dec = loop.Decoder(loaded.model, arch, params, policy, passes=passes)
    wrong = next(t for t in range(3, 1000) if t not in truth)
    issued = []

    def every_other(history, tree, _confidence):
        issued.append(len(history))
        return (graft(tree, 0, [wrong] * 2) if len(issued) % 2 == 0 else tree), True

    dec.graft = every_other
    state = loop.prefilled(dec, prompt)
    run = loop.Grafting(dec, state, SamplingParams())
    decided, lengths, on_host = [], [], []
    while len(decided) < 30:
        if decided:  # the oracle's draft in place of the streams': the truth at rank 0
            ahead = [[truth[len(decided) + j], wrong] for j in range(2)]
            run.host.drafts = ahead
            state.drafts = mx.array(ahead, dtype=mx.uint32)
        pending = run.issue()
        on_host.append(run.on_host)
        step = run.settle(pending)
        decided += step.tokens
        lengths.append(len(step.tokens))
    assert decided == truth[: len(decided)]
    assert on_host == [i % 2 == 1 for i in range(len(on_host))]
    assert lengths[1:] == [3] * (len(lengths) - 1)
    if not shared:  # the rows before the last pass are plain decoding's (lossless streams)
        at = len(prompt) - 1 + len(decided) - lengths[-1]
        ref = loop.make_cache(loaded.model)
        loaded.model(mx.array((prompt + decided)[:at])[None], cache=ref)
        for mine, theirs in zip(state.caches, ref, strict=True):
            assert mx.allclose(mine.keys[..., :at, :], theirs.keys[..., :at, :], atol=1e-4)
            assert mx.allclose(mine.values[..., :at, :], theirs.values[..., :at, :], atol=1e-4)


def _where_passes_run(monkeypatch, passes: Passes) -> list[str]:
    """Record, per pass of `passes`, whether it settled on the device (a whole greedy step)
    or ran for the host to read back."""
    ran = []
    for name, where in (("step", "device"), ("logits", "host")):
        method = getattr(passes, name)

        def run(*args, _method=method, _where=where, **kwargs):
            ran.append(_where)
            return _method(*args, **kwargs)

        monkeypatch.setattr(passes, name, run)
    return ran


def test_ss_pld_grafts_where_greedy_streams_draft_a_tree(tiny_models):
    from specstream_mlx.sampling import SamplingParams
    from specstream_mlx.session import Options, resolve

    loaded = tiny_models["llama"]
    params = streams_for(loaded, 8, gamma=2, n_msa_layers=2, top_k=1, max_tree_nodes=3)
    opts = Options(decoder="ss+pld", streams=params)
    greedy = resolve(loaded, opts, SamplingParams())
    assert greedy.decoder.graft is not None and greedy.decoder.drafter is None
    assert greedy.tree["lookup"] == "grafted"
    sampled = resolve(loaded, opts, SamplingParams(temperature=0.7))
    assert sampled.decoder.graft is None and sampled.decoder.drafter is not None
    assert sampled.tree["lookup"] == "chains"
    lookup = resolve(loaded, Options(decoder="pld"), SamplingParams())
    assert lookup.decoder.graft is None and lookup.tree["lookup"] == "chains"
    # a tree the early-exit head may cut would cut grafted nodes too: chains instead
    pruned = streams_for(loaded, 8, gamma=2, n_msa_layers=2, top_k=2, max_tree_nodes=3)
    cut = resolve(loaded, Options(decoder="ss+pld", streams=pruned), SamplingParams())
    assert cut.decoder.graft is None and cut.tree["lookup"] == "chains"


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_lookup_drafts_from_earlier_answers_and_equals_plain_greedy(tiny_models, family):
    from specstream_mlx.session import lookup_memory

    loaded, prompt = tiny_models[family], "the cat sat on"
    kept, loaded.lookup_memory = loaded.lookup_memory, {}
    try:
        plain = ss.generate(loaded, prompt, max_tokens=24)
        fresh = ss.generate(loaded, prompt, max_tokens=24, decoder="pld")
        again = ss.generate(loaded, prompt, max_tokens=24, decoder="pld")
        # its own prompt's answer (kept by the first) is never recalled
        assert fresh.stats.tree["recalled_tokens"] == again.stats.tree["recalled_tokens"] == 0
        lookup_memory(loaded).add([1, 2, 3], plain.token_ids)  # another prompt's, the same
        recalled = ss.generate(loaded, prompt, max_tokens=24, decoder="pld")
        assert recalled.stats.tree["recalled_tokens"] == len(plain.token_ids) + 1
        assert recalled.token_ids == plain.token_ids == fresh.token_ids
        if family == "llama":  # qwen2's tiny model repeats one token: the context drafts it whole
            assert recalled.stats.forward_passes < fresh.stats.forward_passes
        params = streams_for(loaded, 3, gamma=2, n_msa_layers=2, top_k=1, max_tree_nodes=3)
        grafted = ss.generate(loaded, prompt, max_tokens=24, decoder="ss+pld", streams=params)
        assert grafted.stats.tree["lookup"] == "grafted"
        assert grafted.stats.tree["recalled_tokens"] > 0
        assert grafted.token_ids == plain.token_ids
    finally:
        loaded.lookup_memory = kept


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_pld_gated_by_the_latency_curve_equals_plain_greedy(tiny_models, family):
    loaded = tiny_models[family]
    prompt = "a b c a b c a b c a b"
    plain = ss.generate(loaded, prompt, max_tokens=16)
    runs = {}
    try:
        for per_row in (0.0, 1000.0):  # extra rows free, or costing a pass each
            loaded.latency_curve = flat_curve(loaded, per_row=per_row)
            runs[per_row] = ss.generate(loaded, prompt, max_tokens=16, decoder="pld")
    finally:
        loaded.latency_curve = None
    for run in runs.values():
        assert run.token_ids == plain.token_ids
        assert run.stats.tree["lookup_gated"]
    assert runs[0.0].stats.tree_nodes > runs[0.0].stats.forward_passes  # chains drafted
    assert runs[1000.0].stats.tree_nodes == runs[1000.0].stats.forward_passes  # none pays


def test_ss_pld_gated_against_the_calibrated_tree_equals_plain_greedy(tiny_models):
    loaded = tiny_models["llama"]
    params = streams_for(loaded, 8, gamma=2, n_msa_layers=2, top_k=1, max_tree_nodes=2)
    params.acceptance = Acceptance(2, 100, {(0,): 100, (0, 0): 100, (1,): 1})
    prompt = "a b c a b c a b c a b"
    plain = ss.generate(loaded, prompt, max_tokens=16)
    try:
        loaded.latency_curve = flat_curve(loaded, per_row=0.01)
        both = ss.generate(loaded, prompt, max_tokens=16, decoder="ss+pld", streams=params)
    finally:
        loaded.latency_curve = None
    assert both.token_ids == plain.token_ids
    assert both.stats.tree["source"] == "calibrated" and both.stats.tree["lookup_gated"]
    assert both.stats.tree["lookup"] == "grafted"


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_ss_pld_after_a_cut_tree_crossing_a_buffer_step_equals_plain_greedy(tiny_models, family):
    """An uncalibrated adapter whose tree the early-exit head cuts (more nodes than it keeps)
    runs eagerly: the lower layers' caches take every node's row and grow by mlx-lm's step past
    the MSA layers' ones, which keep only the cut tree's. The lookup's chains run compiled
    between such passes, over buffers of one capacity (a 0.5B model's chat prompt of 212
    tokens crashed here)."""
    loaded = tiny_models[family]
    params = streams_for(loaded, 3, gamma=3, n_msa_layers=2, top_k=3, max_tree_nodes=8)
    prompt = [5 + i % 7 for i in range(230)]  # 229 cached: + 40 nodes crosses 256, + 8 not
    plain = ss.generate(loaded, prompt, max_tokens=24)
    both = ss.generate(loaded, prompt, max_tokens=24, decoder="ss+pld", streams=params)
    assert both.token_ids == plain.token_ids
    assert both.stats.tree["lookup"] == "chains" and both.stats.forward_passes < 24


@EXAMPLES
@given(
    family=st.sampled_from(sorted(FAMILIES)),
    words=WORDS,
    length=st.integers(1, 24),
)
def test_pld_equals_plain_greedy(tiny_models, family, words, length):
    loaded = tiny_models[family]
    prompt = " ".join(words * 3)  # repeats: the lookup finds matches
    plain = ss.generate(loaded, prompt, max_tokens=length)
    pld = ss.generate(loaded, prompt, max_tokens=length, decoder="pld")
    assert pld.token_ids == plain.token_ids
    assert pld.finish_reason == plain.finish_reason
    assert pld.stats.forward_passes <= plain.stats.forward_passes


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_verifier_accepts_exactly_the_matching_prefix(tiny_models, family):
    """Drafts that follow the greedy output for a while, then go wrong: every pass keeps the
    right prefix plus the correction, and the output stays plain greedy."""
    loaded = tiny_models[family]
    prompt_ids = encode_prompt(loaded, "verify these drafts")
    loaded.eos_token_ids, eos = set(), loaded.eos_token_ids  # 30 tokens whatever they are
    try:
        truth = ss.generate(loaded, prompt_ids, max_tokens=30).token_ids
        rng = random.Random(0)

        def drafter(history, hidden):
            assert (hidden is None) == (len(history) == len(prompt_ids))
            done = len(history) - len(prompt_ids)
            right = rng.randrange(0, 5)
            chain = truth[done : done + right] + [rng.randrange(100) for _ in range(2)]
            return draft_tree(history[-1], [[t] for t in chain])

        chunks = ss.stream_generate(
            loaded, prompt_ids, max_tokens=30, decoder="pld", drafter=drafter
        )
        chunks = list(chunks)
    finally:
        loaded.eos_token_ids = eos
    assert [t for c in chunks for t in c.token_ids] == truth
    assert chunks[-1].stats.mean_accepted_tokens > 1.5


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_pld_and_ss_pld_with_a_shared_adapter_equal_its_plain_decoding(tiny_models, family):
    loaded = tiny_models[family]
    from specstream_mlx.streams.lora import apply_lora, remove_lora

    from .test_shared import randomize_lora

    apply_lora(loaded.model, rank=4, scale=2.0)
    randomize_lora(loaded.model, seed=3)
    loaded.streams = shared_streams(loaded, 4, gamma=2, n_msa_layers=2, max_tree_nodes=2)
    try:
        prompt = "a b c a b c a b c a b"
        plain = ss.generate(loaded, prompt, max_tokens=20)
        pld = ss.generate(loaded, prompt, max_tokens=20, decoder="pld")
        both = ss.generate(loaded, prompt, max_tokens=20, decoder="ss+pld", streams=loaded.streams)
    finally:
        loaded.streams = None
        remove_lora(loaded.model)
    assert pld.token_ids == plain.token_ids
    assert both.token_ids == plain.token_ids


def test_default_model_pld_copies_from_the_prompt(default_model):
    text = "The quick brown fox jumps over the lazy dog near the old river bank."
    prompt = f"Repeat this sentence exactly, twice: {text}"
    plain = ss.generate(default_model, prompt, max_tokens=40)
    pld = ss.generate(default_model, prompt, max_tokens=40, decoder="pld")
    assert pld.token_ids == plain.token_ids
    assert pld.stats.mean_accepted_tokens > 1.0  # some drafts were accepted


@EXAMPLES
@given(
    family=st.sampled_from(sorted(FAMILIES)),
    words=WORDS,
    top_k=st.integers(1, 3),
    cap=st.integers(1, 8),
    length=st.integers(1, 24),
    seed=st.integers(0, 1000),
)
def test_ss_with_lookup_equals_plain_greedy(tiny_models, family, words, top_k, cap, length, seed):
    loaded = tiny_models[family]
    params = streams_for(loaded, seed, gamma=2, top_k=top_k, n_msa_layers=2, max_tree_nodes=cap)
    prompt = " ".join(words * 3)
    plain = ss.generate(loaded, prompt, max_tokens=length)
    both = ss.generate(loaded, prompt, max_tokens=length, decoder="ss+pld", streams=params)
    assert both.token_ids == plain.token_ids
    assert both.finish_reason == plain.finish_reason
    assert both.stats.forward_passes <= plain.stats.forward_passes


@pytest.mark.parametrize(
    "prompt_ids, lookup, first_tree",
    [
        ([5, 6, 7, 8, 5, 6, 7], LookupConfig(), [7, 8, 5, 6, 7]),  # a match: 4 tokens, past the cap
        ([5, 6, 7, 8, 5, 6, 7], LookupConfig(max_draft=2), [7, 8, 5]),
        ([5, 6, 7, 8, 5, 6, 7], None, [7]),  # ss alone: no stream draft before the first pass
        ([1, 2, 3, 4], LookupConfig(), [4]),  # no match
    ],
)
def test_lookup_match_replaces_the_stream_draft(
    tiny_models, monkeypatch, prompt_ids, lookup, first_tree
):
    loaded = tiny_models["llama"]
    params = streams_for(loaded, 0, gamma=2, top_k=1, n_msa_layers=2, max_tree_nodes=2)
    trees = []

    def recording(arch, params, tree, *args):
        trees.append(tree.tokens)
        return tree_forward(arch, params, tree, *args)

    monkeypatch.setattr(loop, "tree_forward", recording)
    arch = arch_of(loaded.model, loaded.config["model_type"])
    drafter = None if lookup is None else lookup_drafter(lookup)
    dec = loop.Decoder(loaded.model, arch, params, TreePolicy.of(params.config), drafter)
    steps = list(loop.decode(dec, prompt_ids, 6))
    assert trees[0] == first_tree
    assert steps[0].tree_nodes_kept == len(first_tree)  # a lookup chain is not cut to 2 nodes
    # Without a match the draft is the streams' (their 2-node cap), with one the lookup's chain.
    history = list(prompt_ids)
    for tree, step in zip(trees, steps, strict=True):
        copied = lookup_draft(history, lookup) if lookup else []
        if copied:
            assert tree == [history[-1], *copied]
        else:
            assert len(tree) <= 2
        history += step.tokens


@EXAMPLES
@given(
    family=st.sampled_from(sorted(FAMILIES)),
    words=WORDS,
    top_k=st.integers(1, 3),
    cap=st.integers(1, 6),
    compiled=st.booleans(),
    length=st.integers(1, 20),
    seed=st.integers(0, 1000),
)
def test_lossless_streams_sitting_chain_passes_out_keep_plain_greedy(
    tiny_models, monkeypatch, family, words, top_k, cap, compiled, length, seed
):
    """A pass verifying a lookup chain may run no stream rows (`chain_streams` False): the
    output stays plain decoding's, such passes run the model alone (no stream rows, no stream
    logits), and the pass after one drafts nothing from the streams: the lookup's chain again,
    or the root alone."""
    loaded = tiny_models[family]
    params = streams_for(loaded, seed, gamma=2, top_k=top_k, n_msa_layers=2, max_tree_nodes=cap)
    prompt_ids = encode_prompt(loaded, " ".join(words * 3))
    plain = ss.generate(loaded, prompt_ids, max_tokens=length)
    arch = arch_of(loaded.model, loaded.config["model_type"])
    dec = loop.Decoder(loaded.model, arch, params, TreePolicy.of(params.config))
    dec.passes = Passes(arch, params, compiled)
    dec.drafter, dec.chain_streams = lookup_drafter(LookupConfig()), False
    calls = []  # per pass: the tree, the streams the forward ran per node, the heads read
    logits, tree_forward_ = dec.passes.logits, loop.tree_forward

    def compiled(tree, caches, n_streams=0, heads="main", drafted=None):
        calls.append((tree.tokens, n_streams, heads != "main"))
        return logits(tree, caches, n_streams, heads, drafted)

    def eager(arch, params, tree, caches, n_streams=None, stream_logits=True, prune=None):
        calls.append((tree.tokens, n_streams, stream_logits))
        return tree_forward_(arch, params, tree, caches, n_streams, stream_logits, prune)

    dec.passes.logits = compiled
    monkeypatch.setattr(loop, "tree_forward", eager)
    steps = list(loop.decode(dec, prompt_ids, length))
    tokens = [t for s in steps for t in s.tokens]
    eos = loaded.eos_token_ids
    cut = next((i + 1 for i, t in enumerate(tokens) if t in eos), len(tokens))
    assert tokens[:cut] == plain.token_ids[:cut]
    streams = dec.n_streams if dec.policy.depth > 0 else 0
    history, after_chain = list(prompt_ids), False
    for (tree, n_streams, drafts), step in zip(calls, steps, strict=True):
        copied = lookup_draft(history, LookupConfig())
        if copied:
            assert tree == [history[-1], *copied]
            assert (n_streams, drafts) == (0, False)
        else:
            assert n_streams == streams and drafts == (streams > 0)
            assert len(tree) == 1 or not after_chain
        after_chain = bool(copied)
        history += step.tokens


def test_lossless_streams_sit_chains_out_where_the_curve_says_their_rows_cost_more(tiny_models):
    """`ss+pld` with lossless streams: chain passes run the streams where their rows are
    nearly free, and skip them where the rows cost more than the streams' tree gains a token;
    shared streams always run (the main stream attends to them). Each output is plain greedy's,
    and the result says which ran."""
    loaded = tiny_models["llama"]
    params = streams_for(loaded, 8, gamma=2, n_msa_layers=2, top_k=1, max_tree_nodes=2)
    prompt = "a b c a b c a b c a b"
    plain = ss.generate(loaded, prompt, max_tokens=16)
    ran = {}
    try:
        for right, per_row in ((100, 0.01), (50, 0.1)):
            # streams always right on nearly free rows; right half the time where a row costs
            # a tenth of a one-row layer (the 2-node tree still pays)
            params.acceptance = Acceptance(2, 100, {(0,): right, (0, 0): right * right // 100})
            loaded.latency_curve = flat_curve(loaded, per_row=per_row)
            loaded.trees.clear()
            out = ss.generate(loaded, prompt, max_tokens=16, decoder="ss+pld", streams=params)
            assert out.token_ids == plain.token_ids
            assert out.stats.tree["source"] == "calibrated"
            ran[per_row] = out.stats.tree["chain_streams"]
            # rows nearly free: the lookup's chains are grafted onto the streams' tree
            grafted = out.stats.tree["lookup"] == "grafted"
            assert grafted == out.stats.tree["chain_streams"]
    finally:
        loaded.latency_curve = None
        loaded.trees.clear()
    assert ran == {0.01: True, 0.1: False}


def test_the_grafting_gates_evidence_is_kept_per_streams_on_the_loaded_model(tiny_models):
    from specstream_mlx.session import lookup_rates

    loaded = tiny_models["llama"]
    one, two = (streams_for(loaded, seed, gamma=2, n_msa_layers=2) for seed in (0, 1))
    kept = lookup_rates(loaded, one)
    kept.first[("deep", 2)] = [1.0, 0.0]
    assert lookup_rates(loaded, one) is kept  # the next generation with the same streams
    assert lookup_rates(loaded, two).first == {}  # other streams learn their own
