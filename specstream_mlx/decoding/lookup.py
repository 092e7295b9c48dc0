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


def lookup_drafter(config: LookupConfig):
    """Prompt lookup as a drafter (decoding.host.Drafter): the chain that followed the
    context's last n-gram before."""

    def draft(history: list[int], _hidden) -> Tree:
        return draft_tree(history[-1], [[t] for t in lookup_draft(history, config)])

    return draft
