"""Prompt lookup decoding (Saxena, 2023): draft the tokens that followed the latest earlier
occurrence of the context's last n-gram. No training and no extra parameters; the drafts are
verified by the same tree step as the streams' (lossless: greedy output equals plain decoding).
Strong when the answer copies from the prompt (summaries, SQL over a schema), weak otherwise.

With the streams (`ss+pld`, greedy) the lookup's chains are grafted onto the streams' tree
rather than drafted instead of it: the chain after the context's last n-gram under the root,
and the chain after the context extended by the tree's deepest path under its deepest node, so
a copied run can be accepted past the streams' depth in the same pass; and, for lossless
streams, where the chain alone is expected to decide more tokens per ms than that tree, a pass
verifies it alone (the streams sitting it out where that pays too).

Where the context holds no match of 2 tokens or more, the lookup also searches the answers of
earlier generations (`LookupMemory`), rated apart from the context's matches."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field, replace

import numpy as np

from .host import Grafter
from .tree import Tree, draft_tree


@dataclass(frozen=True)
class LookupConfig:
    ngram_max: int = 3  # try the longest suffix first: a longer match predicts better
    ngram_min: int = 1
    max_draft: int = 4  # tokens proposed per pass (each costs a little verification work)
    # tokens proposed from an earlier answer (LookupMemory): a query or summary of the same
    # table or text repeats runs longer than the context's copies (docs/BENCHMARKS.md,
    # "Lookup remembers earlier answers")
    recall_draft: int = 8


# Grafts follow 2-gram matches or longer: on the dialogsum and e2e writing tools' probes a
# 1-gram's chains cost more than they gave (sql gained 2%; docs/BENCHMARKS.md, "Lookup grafted
# onto the streams' tree").
GRAFT = LookupConfig(ngram_min=2)


class LookupMemory:
    """The answers of earlier generations, one per prompt (its latest; the last `size` tokens
    of them kept), where the lookup looks for the context's last n tokens (n >= 2) when the
    context itself holds them nowhere: a writing tool asked again about the same table or text
    repeats much of its earlier answers. Kept per model and adapter (session.lookup_memory);
    it changes which tokens are drafted, never which are decided. A generation recalls every
    answer but its own prompt's: greedy decoding would repeat that one whole, and a benchmark
    that runs a prompt again would time a copy."""

    END = -1  # between two answers: no draft runs past it

    def __init__(self, size: int = 16384):
        self.size = size
        self.answers: dict[int, np.ndarray] = {}  # hash of the prompt's tokens -> its answer

    def add(self, prompt: list[int], answer: list[int]) -> None:
        key = hash(tuple(prompt))
        self.answers.pop(key, None)
        if answer:
            self.answers[key] = np.asarray([*answer, self.END], np.int64)
        while sum(len(a) for a in self.answers.values()) > self.size:
            del self.answers[next(iter(self.answers))]  # the oldest goes first

    def recall(self, prompt: list[int]) -> np.ndarray:
        """Every answer kept but `prompt`'s, joined: what a generation from it searches."""
        key = hash(tuple(prompt))
        kept = [a for k, a in self.answers.items() if k != key]
        return np.concatenate(kept) if kept else np.zeros(0, np.int64)


def recall_match(
    recalled: np.ndarray, history: list[int], config: LookupConfig
) -> tuple[list[int], int]:
    """Up to `recall_draft` tokens (not past their answer's end) that followed the latest
    occurrence in `recalled` (LookupMemory.recall) of the last n tokens of `history` (n from
    ngram_max down to 2), and n; ([], 0) where none occurs."""
    tokens = np.asarray(history)
    lengths = range(min(config.ngram_max, len(tokens)), 1, -1)
    draft, n = _follows(tokens, lengths, config.recall_draft, recalled)
    if LookupMemory.END in draft:
        draft = draft[: draft.index(LookupMemory.END)]
    return (draft, n) if draft else ([], 0)


def lookup_draft(history: list[int], config: LookupConfig = LookupConfig()) -> list[int]:
    """Up to `max_draft` tokens that followed the most recent earlier occurrence of the last n
    tokens of `history` (n from ngram_max down to ngram_min); [] when nothing matches."""
    return lookup_match(history, config)[0]


def lookup_match(
    history: list[int], config: LookupConfig = LookupConfig(), recalled: np.ndarray | None = None
) -> tuple[list[int], int]:
    """`lookup_draft`'s tokens and the length n of the n-gram they follow (0: no match); with
    `recalled` earlier answers (LookupMemory.recall), where the context holds no match of 2
    tokens or more, their match (n < 0: -n tokens matched in an earlier answer) before a
    1-gram's."""
    tokens = np.asarray(history)
    lengths = range(min(config.ngram_max, len(tokens) - 1), config.ngram_min - 1, -1)
    if recalled is None:
        return _follows(tokens, lengths, config.max_draft)
    draft, n = _follows(tokens, [n for n in lengths if n >= 2], config.max_draft)
    if not draft:
        draft, n = recall_match(recalled, history, config)
        n = -n
    if not draft and config.ngram_min <= 1 < len(tokens):
        draft, n = _follows(tokens, [1], config.max_draft)
    return draft, n


def _follows(tokens: np.ndarray, lengths, count: int, corpus=None) -> tuple[list[int], int]:
    """The `count` tokens after the latest occurrence of the last n of `tokens`, for the first n
    in `lengths` that occurs, and n; ([], 0) where none does. Searched in `corpus` (default:
    `tokens` themselves, their last n not counting as an occurrence)."""
    searched = tokens[:-1] if corpus is None else corpus
    source = tokens if corpus is None else corpus
    for n in lengths:
        if len(searched) < n:
            continue
        # windows[i] = searched[i : i + n]
        windows = np.lib.stride_tricks.sliding_window_view(searched, n)
        hits = np.nonzero((windows == tokens[-n:]).all(axis=1))[0]
        if len(hits):
            start = int(hits[-1]) + n
            return source[start : start + count].tolist(), n
    return [], 0


# The kinds of chain a gate rates apart (docs/BENCHMARKS.md, "Which grafted nodes the text
# takes"): a chain under the root whose first token no stream drafted (right about a third as
# often as the chains the streams agree with), a chain under the root that goes on past drafts
# the streams made too, and a chain past the streams' deepest path (right only where that path
# is: 0.14 of its first nodes taken on e2e, 0.54-0.65 on dialogsum and sql).
ROOT, AFTER_SHARED, DEEP = "root", "after-shared", "deep"
# And the chain under the root scored on its own, whatever the streams drafted: how often a pass
# verifying that chain alone, instead of the grafted tree, gets its first token.
CHAIN = "chain"


@dataclass(frozen=True)
class _Proposal:
    start: int  # where its first token would go in the decoded text
    tokens: list[int]
    # which first-token rate it scores: (chain kind, n-gram length; negative from LookupMemory)
    rate: tuple[str, int]
    after: tuple[int, ...] = ()  # the text it needs just before `start` (else its first is wrong)
    scored: int = 0  # tokens already scored against the decoded text
    first_only: bool = False  # its later tokens count toward no rate (scored by another)


@dataclass(frozen=True)
class LookupCosts:
    """What a lookup chain is weighed against: ms per pass in the decoding loop (the latency
    curve's), for a chain of L drafts (L = 0 .. max_draft), and for the pass that runs when no
    chain is drafted (plain decoding's one token, or the streams' tree)."""

    chain_ms: tuple[float, ...]  # chain_ms[L]: a pass verifying the root and L drafts
    fallback_tokens: float = 1.0  # tokens decided per pass of what runs instead
    fallback_ms: float | None = None  # its ms; None: chain_ms[0]
    # a gated tree's: tokens decided per pass of each bin's tree, bins[b] where
    # gates[b - 1] <= stream 1's confidence < gates[b] (decoding.plan.TreePlan.bin_tokens)
    gates: tuple[float, ...] = ()
    bin_tokens: tuple[float, ...] = ()
    # lossless streams: chain_ms's passes with the streams sitting them out (the pass after
    # then drafts nothing from them); () where they must run (shared mode)
    bare_ms: tuple[float, ...] = ()

    def bare_penalty(self) -> float:
        """What the pass after a chain verified without the streams loses where no chain
        follows it: the root alone (streams running) instead of the streams' tree, in ms (its
        ms less the tree's ms a token)."""
        fallback_ms = self.chain_ms[0] if self.fallback_ms is None else self.fallback_ms
        return max(self.chain_ms[0] - fallback_ms / self.fallback_tokens, 0.0)

    def offers_alone(self) -> bool:
        """Whether a pass may verify the lookup's chain alone instead of the streams' tree:
        where the streams may sit it out (lossless) and the tree is the calibrated one, whose
        tokens a pass are known. Streams that must run (shared) measured no faster with it
        (docs/BENCHMARKS.md, "`ss+pld` verifies the lookup's chain alone")."""
        return bool(self.bare_ms) and self.fallback_ms is not None

    def tree_tokens(self, confidence: float) -> float:
        """Tokens per pass the streams' calibrated tree decides at this confidence of stream 1
        (its bin's where gated)."""
        if self.bin_tokens:
            return self.bin_tokens[bisect.bisect_right(self.gates, confidence)]
        return self.fallback_tokens

    def nodes_ms(self, nodes: int) -> float:
        """A pass of `nodes` nodes (root included), extended past the last measured length by
        its last step."""
        ms, last = self.chain_ms, len(self.chain_ms) - 1
        if nodes - 1 <= last:
            return ms[nodes - 1]
        return ms[last] + (nodes - 1 - last) * (ms[last] - ms[max(last - 1, 0)])

    def node_ms(self, nodes: int) -> float:
        """What one more node costs a pass of `nodes` nodes: the mean step from there to the
        largest pass priced (`chain_ms`'s last), not the curve's local step. The curve's
        steps are noisy (two sizes pooled into one level price a node at almost nothing: the
        dev CPU's 6 to 8 nodes, 9-10 ms a node where its passes grew ~23; docs/BENCHMARKS.md,
        "A memory-starved instance"), and a grafted chain grows the pass several nodes at once."""
        top = len(self.chain_ms)
        if nodes + 1 >= top:
            return self.nodes_ms(nodes + 1) - self.nodes_ms(nodes)
        return (self.chain_ms[-1] - self.nodes_ms(nodes)) / (top - nodes)


@dataclass
class LookupRates:
    """A `LookupGate`'s evidence, as pseudo-counts [right, wrong], each fading by
    `LookupGate.DECAY` when it gains one: a chain's first new node's, per (chain kind, length
    of the matched n-gram: negative where matched in an earlier answer), and a new node's
    after a right one. Grafting keeps it per streams on the loaded model from one generation
    to the next (session.lookup_rates): a writing tool's answer holds too few chains of a kind
    to learn its rate within one (e2e: about two past the streams' path in a 26-token answer)."""

    first: dict = field(default_factory=dict)  # (kind, n) -> [right, wrong]
    next: list = field(default_factory=lambda: [0.0, 0.0])
    # after a pass verifying the lookup's chain alone: [the next pass had a match, had none]
    followed: list = field(default_factory=lambda: [0.0, 0.0])


class LookupGate:
    """How often the lookup's drafts turn out right, and whether a draft pays for its place in
    the pass. Two rates: a chain's first new node's, per kind of chain (`ROOT`, `AFTER_SHARED`,
    `DEEP`) and length of the matched n-gram (a 3-gram match is right far more often than a
    1-gram one: 0.75-0.87 against 0.18-0.40 on the chat and sql suites), counted right only
    where the text also took what leads to it (the drafts before it that the streams made too,
    the streams' deepest path), so it is the chance of reaching it; and the next new nodes'
    once the ones before were right (0.6-0.9 whatever the n-gram: one rate). Every chain is
    scored against the text decoded after it, token by token as the text arrives, drafted or
    not (greedy decoding keeps exactly the drafts that match it), so a lookup the gate stopped
    drafting is still watched and drafts again once its proposals match. Each count fades by
    `DECAY` as it gains one, over fixed priors (`FIRST` per kind, `NEXT`: pseudo-counts of
    right and wrong); the evidence (`LookupRates`) may come from earlier generations."""

    DECAY = 0.9
    FIRST = {ROOT: (0.5, 0.5), AFTER_SHARED: (0.75, 1.25), DEEP: (0.5, 1.5), CHAIN: (0.5, 0.5)}
    NEXT = (1.5, 0.5)
    FOLLOWED = (1.0, 1.0)

    def __init__(self, costs: LookupCosts, rates: LookupRates | None = None):
        self.costs = costs
        self.evidence = LookupRates() if rates is None else rates
        self.pending: list[_Proposal] = []  # not yet settled by the decoded text

    def rates(self, n: int, kind: str = ROOT) -> tuple[float, float]:
        """After an n-gram match, for a chain of `kind`: P(its first new node is reached),
        P(a new node right | those before right)."""
        (r, w), (pr, pw) = self.evidence.first.get((kind, n), (0.0, 0.0)), self.FIRST[kind]
        first = (r + pr) / (r + w + pr + pw)
        (r, w), (pr, pw) = self.evidence.next, self.NEXT
        return first, (r + pr) / (r + w + pr + pw)

    def count_followed(self, matched: bool) -> None:
        """Count whether this pass, after one verifying the chain alone, has a chain too."""
        self._count(self.evidence.followed, matched)

    def follow_rate(self) -> float:
        """P(the pass after one verifying the chain alone has a chain too)."""
        (r, w), (pr, pw) = self.evidence.followed, self.FOLLOWED
        return (r + pr) / (r + w + pr + pw)

    def _count(self, counts: list[float], right: bool) -> None:
        counts[:] = [c * self.DECAY for c in counts]
        counts[0 if right else 1] += 1.0

    def observe(self, history: list[int]) -> None:
        """Score the proposed tokens the decoded `history` now settles."""
        waiting = []
        for p in self.pending:
            seen = history[p.start : p.start + len(p.tokens)]
            for j in range(p.scored, len(seen)):
                right = seen[j] == p.tokens[j]
                if j == 0:
                    right = right and history[p.start - len(p.after) : p.start] == list(p.after)
                    self._count(self.evidence.first.setdefault(p.rate, [0.0, 0.0]), right)
                else:
                    self._count(self.evidence.next, right)
                if not right or p.first_only:
                    break
            else:
                if len(seen) < len(p.tokens):  # right so far: more text will tell
                    waiting.append(replace(p, scored=len(seen)))
        self.pending = waiting

    def watch(
        self, start: int, tokens: list[int], rate: tuple[str, int], after=(), first_only=False
    ) -> None:
        """Keep `tokens` (drafts for the text from `start` on) to score later: the first
        against `rate`, right only where the text holds `after` just before `start`; the next
        ones against the rate of a new node after a right one, unless `first_only`."""
        if tokens:
            self.pending.append(_Proposal(start, list(tokens), rate, tuple(after), 0, first_only))

    def choose(self, history: list[int], proposal: list[int], n: int) -> int:
        """Score what `history` settles, watch `proposal` (the lookup's drafts after
        `history`, following an n-gram match), and return how many of it to verify: the L with
        the most expected tokens per ms, 0 when the pass that runs instead does better."""
        self.observe(history)
        self.watch(len(history), proposal, (ROOT, n))
        costs = self.costs
        fallback_ms = costs.chain_ms[0] if costs.fallback_ms is None else costs.fallback_ms
        bar = costs.fallback_tokens / fallback_ms
        return _best_chain(len(proposal), self.rates(n), bar, costs.chain_ms)[0]

    def instead(self, proposal: list[int], n: int, tree: Tree, tokens: float) -> tuple[int, bool]:
        """How many of `proposal` (the lookup's drafts after an n-gram match) to verify alone
        instead of `tree` (the streams' tree with the chains grafted on), which is expected to
        decide `tokens` a pass, and whether the streams run in that pass: the L with the most
        expected tokens per ms, (0, True) to keep `tree`. The chain's first token is rated on
        its own (`CHAIN`), the next ones as grafted ones. The streams may sit the pass out
        (`bare_ms`), its price then raised by what the pass after loses where no chain follows.
        Asked only where the costs offer it (`LookupCosts.offers_alone`)."""
        costs, rates = self.costs, self.rates(n, CHAIN)
        ms = [costs.nodes_ms(size + 1) for size in range(len(proposal) + 1)]
        size, rate = _best_chain(len(proposal), rates, tokens / costs.nodes_ms(len(tree)), ms)
        if proposal:
            lost = (1.0 - self.follow_rate()) * costs.bare_penalty()
            bare = _best_chain(len(proposal), rates, rate, [m + lost for m in costs.bare_ms])[0]
            if bare:
                return bare, False
        return size, True

    def worth(self, reach: float, nodes: int) -> bool:
        """Whether a node reached with probability `reach` pays for the pass growing from
        `nodes` nodes to one more, at the rate the pass without it decides tokens (the
        streams' tree: fallback_tokens per fallback_ms)."""
        costs = self.costs
        fallback_ms = costs.chain_ms[0] if costs.fallback_ms is None else costs.fallback_ms
        return reach * fallback_ms >= costs.fallback_tokens * costs.node_ms(nodes)


def _best_chain(length: int, rates: tuple[float, float], bar: float, ms) -> tuple[int, float]:
    """The chain length up to `length` with the most expected tokens per ms above `bar`
    (tokens per ms) and that rate, its first new node reached at rates[0] and each next at
    rates[1] of the one before, ms[L] the ms of a pass verifying L of it; (0, bar) where none
    beats `bar`."""
    best, best_rate = 0, bar
    (reach, later), expected = rates, 1.0
    for size in range(1, length + 1):
        expected += reach
        reach *= later
        if expected / ms[size] > best_rate:
            best, best_rate = size, expected / ms[size]
    return best, best_rate


def graft(tree: Tree, at: int, tokens: list[int], keep=None) -> Tree:
    """`tree` with the chain `tokens` under node `at`, sharing the nodes it already has there;
    `keep(k, nodes)` (k: the new nodes before this one, the tree's size) stops the chain at the
    first new node it declines."""
    tokens_, parents, depths = list(tree.tokens), list(tree.parents), list(tree.depths)
    shared = chain_in(tree, at, tokens)
    node = shared[-1] if shared else at
    for k, token in enumerate(tokens[len(shared) :]):
        if keep is not None and not keep(k, len(tokens_)):
            break
        tokens_.append(token)
        parents.append(node)
        depths.append(depths[node] + 1)
        node = len(tokens_) - 1
    return Tree(tokens_, parents, depths)


def chain_in(tree: Tree, at: int, tokens: list[int]) -> list[int]:
    """The nodes of `tree` that spell the start of `tokens` under node `at`."""
    nodes, node = [], at
    for token in tokens:
        children = (c for c in range(len(tree)) if tree.parents[c] == node)
        node = next((c for c in children if tree.tokens[c] == token), None)
        if node is None:
            break
        nodes.append(node)
    return nodes


def deepest_path(tree: Tree) -> tuple[int, list[int]]:
    """The tree's deepest node (the first of the deepest) and the tokens on its path below the
    root."""
    node = max(range(len(tree)), key=lambda i: (tree.depths[i], -i))
    at, path = node, []
    while at > 0:
        path.append(tree.tokens[at])
        at = tree.parents[at]
    return node, path[::-1]


def lookup_grafter(
    config: LookupConfig = GRAFT,
    costs: LookupCosts | None = None,
    rates: LookupRates | None = None,
    recalled: np.ndarray | None = None,
) -> Grafter:
    """Prompt lookup grafted onto the streams' tree, for one generation: the chain after the
    context's last n-gram under the root, the chain after the context extended by the tree's
    deepest path under its deepest node. Each new node is kept while a `LookupGate` over
    `costs` expects it to pay (the chance of reaching it, rated per kind of chain; from `rates`
    on, the evidence of earlier generations, which it goes on updating), and, for lossless
    streams, the chain under the root is verified alone, without the streams' tree, where the
    gate expects that to decide more tokens per ms (where `costs` carry the calibrated tree's
    tokens per pass), the streams sitting that pass out where that pays too; costs=None grafts
    whole chains; the chains come from `recalled` earlier answers too (LookupMemory.recall),
    where the context has no match of 2 tokens or more. Returns the tree to verify and
    whether the streams run in its pass."""
    gate = None if costs is None else LookupGate(costs, rates)
    alone_before = False  # the last pass verified the chain alone

    def grafted(history: list[int], tree: Tree, confidence: float = 0.0) -> tuple[Tree, bool]:
        nonlocal alone_before
        proposal, n = lookup_match(history, config, recalled)
        deepest, path = deepest_path(tree)
        further, m = lookup_match(history + path, config, recalled) if path else ([], 0)
        if gate is None:
            return graft(graft(tree, 0, proposal), deepest, further), True
        gate.observe(history)
        out, gain = _gated_graft(gate, len(history), tree, (0, []), proposal, n)
        out, more = _gated_graft(gate, len(history), out, (deepest, path), further, m)
        if not gate.costs.offers_alone():
            return out, True
        gate.watch(len(history), proposal, (CHAIN, n), first_only=True)
        if alone_before:
            gate.count_followed(bool(proposal))
        tokens = gate.costs.tree_tokens(confidence) if len(tree) > 1 else 1.0  # root alone: one
        alone, streams = gate.instead(proposal, n, out, tokens + gain + more)
        alone_before = alone > 0
        if alone == 0:
            return out, True
        return draft_tree(history[-1], [[t] for t in proposal[:alone]]), streams

    return grafted


def _gated_graft(gate: LookupGate, start: int, tree: Tree, under, chain: list[int], n: int):
    """`tree` with `chain` (following an n-gram match) grafted under node `under[0]` (whose
    path below the root, `under[1]`, would place it at `start` + len(path) in the text), each
    new node kept where the gate expects it to pay, and the tokens the kept ones are expected
    to add to a pass; the gate watches the new part, rated by its kind: its k-th new node is
    reached with probability first * later^k."""
    at, path = under
    shared = len(chain_in(tree, at, chain))
    kind = DEEP if at else AFTER_SHARED if shared else ROOT
    after = [*path, *chain[:shared]]
    gate.watch(start + len(after), chain[shared:], (kind, n), after)
    first, later = gate.rates(n, kind)
    grown = graft(tree, at, chain, lambda k, nodes: gate.worth(first * later**k, nodes))
    new = len(grown) - len(tree)
    return grown, sum(first * later**k for k in range(new))


def lookup_drafter(
    config: LookupConfig, costs: LookupCosts | None = None, recalled: np.ndarray | None = None
):
    """Prompt lookup as a drafter (decoding.host.Drafter), for one generation: the chain that
    followed the context's last n-gram before (or in the `recalled` earlier answers,
    LookupMemory.recall, where the context has no match of 2 tokens or more), cut to the
    length expected to pay by a `LookupGate` over `costs` (None: always the whole chain)."""
    gate = None if costs is None else LookupGate(costs)

    def draft(history: list[int], _hidden) -> Tree:
        proposal, n = lookup_match(history, config, recalled)
        if gate is not None:
            proposal = proposal[: gate.choose(history, proposal, n)]
        return draft_tree(history[-1], [[t] for t in proposal])

    return draft
