"""Answers that loop are not training material: greedy decoding of a small model often falls
into a cycle ("-X-X-X-X...", the same sentence again and again) that runs to the token cap.

Two masks mark the parts of an answer that are a loop:
- tandem repeats: characters inside a unit (1-200 characters, not only whitespace) repeated
  back to back at least MIN_COPIES times;
- repeated n-grams: words inside word N_GRAM-grams that occur at least MIN_COPIES times anywhere
  in the answer (a sentence repeated with other text in between).
An answer is degenerate when either mask covers at least half of it, or at least 80% of its
second half (a loop that runs to the end).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import numpy as np

MAX_PERIOD = 200  # characters of the longest repeated unit looked for
MIN_COPIES = 3
N_GRAM = 6
WHOLE, TAIL = 0.5, 0.8  # the thresholds on the whole answer and on its second half
MIN_CHARS = 24  # shorter answers are never called degenerate ("Yes. Yes. Yes." may be right)


@dataclass(frozen=True)
class Loop:
    whole: float  # share of the answer inside a loop, in [0, 1]
    tail: float  # ... of its second half

    @property
    def degenerate(self) -> bool:
        return self.whole >= WHOLE or self.tail >= TAIL


def tandem_mask(text: str, max_period: int = MAX_PERIOD, copies: int = MIN_COPIES) -> np.ndarray:
    """(len(text),) bool: characters inside back-to-back repeats of a non-blank unit."""
    n = len(text)
    covered = np.zeros(n, dtype=bool)
    if n < 2:
        return covered
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)  # (n,)
    blank = np.array([c.isspace() for c in text])  # (n,)
    for period in range(1, min(max_period, n // copies) + 1):
        same = codes[:-period] == codes[period:]  # same[i]: text[i] == text[i + period]
        # a run of >= (copies - 1) * period matches is `copies` units back to back
        edges = np.diff(np.concatenate(([0], same.astype(np.int8), [0])))
        starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        long = ends - starts >= (copies - 1) * period
        for s, e in zip(starts[long], ends[long], strict=True):
            if not blank[s : s + period].all():
                covered[s : e + period] = True
    return covered


def ngram_mask(text: str, n: int = N_GRAM, copies: int = MIN_COPIES) -> np.ndarray:
    """(words,) bool: words inside a word n-gram that occurs at least `copies` times."""
    words = re.findall(r"\S+", text.lower())
    covered = np.zeros(len(words), dtype=bool)
    if len(words) < n * copies:
        return covered
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    counts = Counter(grams)
    for i, gram in enumerate(grams):
        if counts[gram] >= copies:
            covered[i : i + n] = True
    return covered


def _shares(mask: np.ndarray) -> tuple[float, float]:
    if not mask.size:
        return 0.0, 0.0
    return float(mask.mean()), float(mask[mask.size // 2 :].mean())


def find_loop(text: str) -> Loop:
    """How much of an answer, and of its second half, is a loop (the larger of the masks)."""
    if len(text.strip()) < MIN_CHARS:
        return Loop(0.0, 0.0)
    (w1, t1), (w2, t2) = _shares(tandem_mask(text)), _shares(ngram_mask(text))
    return Loop(max(w1, w2), max(t1, t2))


def is_degenerate(text: str) -> bool:
    """True when most of the answer, or most of its end, is a loop."""
    return find_loop(text).degenerate
