"""Prompt lookup decoding (Saxena, 2023): draft the tokens that followed the latest earlier
occurrence of the context's last n-gram. No training and no extra parameters; the drafts are
verified by the same tree step as the streams' (lossless: greedy output equals plain decoding).
Strong when the answer copies from the prompt (summaries, SQL over a schema), weak otherwise."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .tree import Tree, draft_tree


@dataclass(frozen=True)
class LookupConfig:
    ngram_max: int = 3  # try the longest suffix first: a longer match predicts better
    ngram_min: int = 1
    max_draft: int = 4  # tokens proposed per pass (each costs a little verification work)


def lookup_draft(history: list[int], config: LookupConfig = LookupConfig()) -> list[int]:
    """Up to `max_draft` tokens that followed the most recent earlier occurrence of the last n
    tokens of `history` (n from ngram_max down to ngram_min); [] when nothing matches."""
    tokens = np.asarray(history)
    for n in range(min(config.ngram_max, len(tokens) - 1), config.ngram_min - 1, -1):
        suffix = tokens[-n:]
        # windows[i] = tokens[i : i + n] for every start but the suffix's own
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)
        hits = np.nonzero((windows == suffix).all(axis=1))[0]
        if len(hits):
            start = int(hits[-1]) + n
            return tokens[start : start + config.max_draft].tolist()
    return []


def lookup_drafter(config: LookupConfig, costs: LookupCosts | None = None):
    """Prompt lookup as a drafter (decoding.host.Drafter), for one generation: the chain that
    followed the context's last n-gram before, cut to the length expected to pay by a
    `LookupGate` over `costs` (None: always the whole chain)."""
    gate = None if costs is None else LookupGate(costs)

    def draft(history: list[int], _hidden) -> Tree:
        proposal = lookup_draft(history, config)
        if gate is not None:
            proposal = proposal[: gate.length(history, proposal)]
        return draft_tree(history[-1], [[t] for t in proposal])

    return draft


@dataclass(frozen=True)
class LookupCosts:
    """What a lookup chain is weighed against: ms per pass in the decoding loop (the latency
    curve's), for a chain of L drafts (L = 0 .. max_draft), and for the pass that runs when no
    chain is drafted (plain decoding's one token, or the streams' tree)."""

    chain_ms: tuple[float, ...]  # chain_ms[L]: a pass verifying the root and L drafts
    fallback_tokens: float = 1.0  # tokens decided per pass of what runs instead
    fallback_ms: float | None = None  # its ms; None: chain_ms[0]


class LookupGate:
    """How often the lookup's drafts turn out right, per depth, in this generation, and the
    chain length expected to decide the most tokens per ms. Every proposal is scored against
    the text decoded after it, drafted or not (greedy decoding keeps exactly the drafts that
    match it), so a lookup the gate stopped drafting is still watched and drafts again once
    its proposals start matching. Recent proposals weigh more (`DECAY` per proposal) over a
    fixed Beta(PRIOR, PRIOR) prior."""

    DECAY = 0.8
    PRIOR = 0.5

    def __init__(self, costs: LookupCosts):
        self.costs = costs
        depth = len(costs.chain_ms) - 1
        self.hits, self.tries = [0.0] * depth, [0.0] * depth
        self.pending: list[tuple[int, list[int]]] = []  # (where it starts, the tokens proposed)

    def rates(self) -> list[float]:
        """P(draft j right | drafts before it right), j = 0 .. max_draft - 1."""
        return [(h + self.PRIOR) / (t + 2 * self.PRIOR) for h, t in zip(self.hits, self.tries)]

    def observe(self, history: list[int]) -> None:
        """Score the proposals whose fate the decoded `history` now settles."""
        waiting = []
        for start, proposal in self.pending:
            seen = history[start : start + len(proposal)]
            right = next((i for i, (a, b) in enumerate(zip(seen, proposal)) if a != b), len(seen))
            if right == len(seen) < len(proposal):  # matches so far: wait for more text
                waiting.append((start, proposal))
                continue
            self.hits = [h * self.DECAY for h in self.hits]
            self.tries = [t * self.DECAY for t in self.tries]
            for j in range(min(right + 1, len(proposal))):
                self.tries[j] += 1.0
                self.hits[j] += float(j < right)
        self.pending = waiting

    def length(self, history: list[int], proposal: list[int]) -> int:
        """How many of `proposal` (the lookup's drafts after `history`) to verify: the L with
        the most expected tokens per ms, 0 when the fallback pass does better."""
        self.observe(history)
        if proposal:
            self.pending.append((len(history), list(proposal)))
        costs = self.costs
        best, best_rate = 0, costs.fallback_tokens / (costs.fallback_ms or costs.chain_ms[0])
        expected, reach = 1.0, 1.0
        for n, rate in enumerate(self.rates()[: len(proposal)], start=1):
            reach *= rate
            expected += reach
            if expected / costs.chain_ms[n] > best_rate:
                best, best_rate = n, expected / costs.chain_ms[n]
        return best
