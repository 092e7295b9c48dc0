"""Prompt lookup decoding (Saxena, 2023): draft the tokens that followed the latest earlier
occurrence of the context's last n-gram. No training and no extra parameters; the drafts are
verified by the same tree step as the streams' (lossless: greedy output equals plain decoding).
Strong when the answer copies from the prompt (summaries, SQL over a schema), weak otherwise.

With the streams (`ss+pld`, greedy) the lookup's chains are grafted onto the streams' tree
rather than drafted instead of it: the chain after the context's last n-gram under the root,
and the chain after the context extended by the tree's deepest path under its deepest node, so
a copied run can be accepted past the streams' depth in the same pass."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .host import Grafter
from .tree import Tree, draft_tree


@dataclass(frozen=True)
class LookupConfig:
    ngram_max: int = 3  # try the longest suffix first: a longer match predicts better
    ngram_min: int = 1
    max_draft: int = 4  # tokens proposed per pass (each costs a little verification work)


# Grafts follow 2-gram matches or longer: on the dialogsum and e2e writing tools' probes a
# 1-gram's chains cost more than they gave (sql gained 2%; docs/BENCHMARKS.md, "Lookup grafted
# onto the streams' tree").
GRAFT = LookupConfig(ngram_min=2)


def lookup_draft(history: list[int], config: LookupConfig = LookupConfig()) -> list[int]:
    """Up to `max_draft` tokens that followed the most recent earlier occurrence of the last n
    tokens of `history` (n from ngram_max down to ngram_min); [] when nothing matches."""
    return lookup_match(history, config)[0]


def lookup_match(
    history: list[int], config: LookupConfig = LookupConfig()
) -> tuple[list[int], int]:
    """`lookup_draft`'s tokens and the length n of the n-gram they follow (0: no match)."""
    tokens = np.asarray(history)
    for n in range(min(config.ngram_max, len(tokens) - 1), config.ngram_min - 1, -1):
        suffix = tokens[-n:]
        # windows[i] = tokens[i : i + n] for every start but the suffix's own
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)
        hits = np.nonzero((windows == suffix).all(axis=1))[0]
        if len(hits):
            start = int(hits[-1]) + n
            return tokens[start : start + config.max_draft].tolist(), n
    return [], 0


@dataclass(frozen=True)
class _Proposal:
    start: int  # where its tokens would go in the decoded text
    tokens: list[int]
    n: int  # the length of the n-gram it followed
    scored: int = 0  # tokens already scored against the decoded text


@dataclass(frozen=True)
class LookupCosts:
    """What a lookup chain is weighed against: ms per pass in the decoding loop (the latency
    curve's), for a chain of L drafts (L = 0 .. max_draft), and for the pass that runs when no
    chain is drafted (plain decoding's one token, or the streams' tree)."""

    chain_ms: tuple[float, ...]  # chain_ms[L]: a pass verifying the root and L drafts
    fallback_tokens: float = 1.0  # tokens decided per pass of what runs instead
    fallback_ms: float | None = None  # its ms; None: chain_ms[0]

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


class LookupGate:
    """How often the lookup's drafts turn out right in this generation, and the chain length
    expected to decide the most tokens per ms. Two rates: the first draft's, per length of the
    matched n-gram (a 3-gram match is right far more often than a 1-gram one: 0.75-0.87 against
    0.18-0.40 on the chat and sql suites), and the next drafts' once the ones before were right
    (0.6-0.9 whatever the n-gram: one rate). Every proposal is scored against the text decoded
    after it, token by token as the text arrives, drafted or not (greedy decoding keeps exactly
    the drafts that match it), so a lookup the gate stopped drafting is still watched and drafts
    again once its proposals match. Older evidence fades by `DECAY` per pass, over fixed priors
    (`FIRST`, `NEXT`: pseudo-counts of right and wrong). Grafting onto the streams' tree, it
    also scores the streams' deepest path (all right or not: `PATH`), which a chain grafted
    past it needs."""

    DECAY = 0.9
    FIRST = (0.5, 0.5)
    NEXT = (1.5, 0.5)
    PATH = (1.0, 1.0)

    def __init__(self, costs: LookupCosts, ngram_max: int):
        self.costs = costs
        self.first = [[0.0, 0.0] for _ in range(ngram_max + 1)]  # [n] -> [right, wrong]
        self.next = [0.0, 0.0]
        self.pending: list[_Proposal] = []  # not yet settled by the decoded text
        self.path = [0.0, 0.0]  # the streams' deepest paths: [right, wrong]
        self.paths: list[tuple[int, list[int]]] = []  # (start, tokens), not yet settled

    def rates(self, n: int) -> tuple[float, float]:
        """After an n-gram match: P(first draft right), P(a draft right | those before right)."""
        (r, w), (pr, pw) = self.first[n], self.FIRST
        first = (r + pr) / (r + w + pr + pw)
        (r, w), (pr, pw) = self.next, self.NEXT
        return first, (r + pr) / (r + w + pr + pw)

    def path_rate(self) -> float:
        """P(the streams' deepest path is right, whole)."""
        (r, w), (pr, pw) = self.path, self.PATH
        return (r + pr) / (r + w + pr + pw)

    def observe(self, history: list[int]) -> None:
        """Score the proposed tokens the decoded `history` now settles."""
        for counts in [*self.first, self.next, self.path]:
            counts[:] = [c * self.DECAY for c in counts]
        for start, tokens in self.paths:
            if start + len(tokens) <= len(history):
                self.path[0 if history[start : start + len(tokens)] == tokens else 1] += 1.0
        self.paths = [(i, t) for i, t in self.paths if i + len(t) > len(history)]
        waiting = []
        for p in self.pending:
            seen = history[p.start : p.start + len(p.tokens)]
            for j in range(p.scored, len(seen)):
                right = seen[j] == p.tokens[j]
                (self.first[p.n] if j == 0 else self.next)[0 if right else 1] += 1.0
                if not right:
                    break
            else:
                if len(seen) < len(p.tokens):  # right so far: more text will tell
                    waiting.append(_Proposal(p.start, p.tokens, p.n, len(seen)))
        self.pending = waiting

    def note(self, history: list[int], proposal: list[int], n: int, path=()) -> None:
        """Score what `history` settles and keep `proposal` (the lookup's drafts after
        `history`, following an n-gram match) and the streams' deepest `path` to score
        later."""
        self.observe(history)
        if proposal:
            self.pending.append(_Proposal(len(history), list(proposal), n))
        if path:
            self.paths.append((len(history), list(path)))

    def choose(self, history: list[int], proposal: list[int], n: int) -> int:
        """`note` the proposal, and return how many of it to verify: the L with the most
        expected tokens per ms, 0 when the pass that runs instead does better."""
        self.note(history, proposal, n)
        costs = self.costs
        fallback_ms = costs.chain_ms[0] if costs.fallback_ms is None else costs.fallback_ms
        best, best_rate = 0, costs.fallback_tokens / fallback_ms
        first, later = self.rates(n)
        expected, reach = 1.0, first
        for size in range(1, len(proposal) + 1):
            expected += reach
            reach *= later
            if expected / costs.chain_ms[size] > best_rate:
                best, best_rate = size, expected / costs.chain_ms[size]
        return best

    def worth(self, reach: float, nodes: int) -> bool:
        """Whether a node reached with probability `reach` pays for the pass growing from
        `nodes` nodes to one more, at the rate the pass without it decides tokens (the
        streams' tree: fallback_tokens per fallback_ms)."""
        costs = self.costs
        fallback_ms = costs.chain_ms[0] if costs.fallback_ms is None else costs.fallback_ms
        return reach * fallback_ms >= costs.fallback_tokens * costs.node_ms(nodes)


def graft(tree: Tree, at: int, tokens: list[int], keep=None) -> Tree:
    """`tree` with the chain `tokens` under node `at`, sharing the nodes it already has there;
    `keep(depth, nodes)` (depth in the chain from 0, the tree's size) stops the chain at the
    first new node it declines."""
    tokens_, parents, depths = list(tree.tokens), list(tree.parents), list(tree.depths)
    node = at
    for i, token in enumerate(tokens):
        child = next(
            (c for c in range(len(tokens_)) if parents[c] == node and tokens_[c] == token), None
        )
        if child is None:
            if keep is not None and not keep(i, len(tokens_)):
                break
            child = len(tokens_)
            tokens_.append(token)
            parents.append(node)
            depths.append(depths[node] + 1)
        node = child
    return Tree(tokens_, parents, depths)


def deepest_path(tree: Tree) -> tuple[int, list[int]]:
    """The tree's deepest node (the first of the deepest) and the tokens on its path below the
    root."""
    node = max(range(len(tree)), key=lambda i: (tree.depths[i], -i))
    at, path = node, []
    while at > 0:
        path.append(tree.tokens[at])
        at = tree.parents[at]
    return node, path[::-1]


def lookup_grafter(config: LookupConfig = GRAFT, costs: LookupCosts | None = None) -> Grafter:
    """Prompt lookup grafted onto the streams' tree, for one generation: the chain after the
    context's last n-gram under the root, the chain after the context extended by the tree's
    deepest path under its deepest node. Each new node is kept while a `LookupGate` over
    `costs` expects it to pay (the chance of reaching it, from the lookup's measured rates and,
    past the streams' path, how often that path was right); costs=None grafts whole chains."""
    gate = None if costs is None else LookupGate(costs, config.ngram_max)

    def grafted(history: list[int], tree: Tree) -> Tree:
        proposal, n = lookup_match(history, config)
        deepest, path = deepest_path(tree)
        further, m = lookup_match(history + path, config) if path else ([], 0)
        if gate is None:
            return graft(graft(tree, 0, proposal), deepest, further)
        gate.note(history, proposal, n, path)
        out = graft(tree, 0, proposal, _keep(gate, n))
        return graft(out, deepest, further, _keep(gate, m, gate.path_rate()))

    return grafted


def _keep(gate: LookupGate, n: int, reach: float = 1.0):
    """The gate's rule for a chain following an n-gram match from a node reached with
    probability `reach`: its i-th token is reached with probability reach * first * later^i."""
    first, later = gate.rates(n)
    return lambda i, nodes: gate.worth(reach * first * later**i, nodes)


def lookup_drafter(config: LookupConfig, costs: LookupCosts | None = None):
    """Prompt lookup as a drafter (decoding.host.Drafter), for one generation: the chain that
    followed the context's last n-gram before, cut to the length expected to pay by a
    `LookupGate` over `costs` (None: always the whole chain)."""
    gate = None if costs is None else LookupGate(costs, config.ngram_max)

    def draft(history: list[int], _hidden) -> Tree:
        proposal, n = lookup_match(history, config)
        if gate is not None:
            proposal = proposal[: gate.choose(history, proposal, n)]
        return draft_tree(history[-1], [[t] for t in proposal])

    return draft
