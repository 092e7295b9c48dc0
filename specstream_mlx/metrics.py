"""Quality measures of a model that do not depend on a decoder."""

from __future__ import annotations

import math
import re

import mlx.core as mx
import mlx.nn as nn

from .errors import SpecstreamError


def perplexity(model: nn.Module, ids: list[int]) -> float:
    """exp(mean next-token NLL) of `ids` under `model`, one forward pass, no BOS added."""
    x = mx.array(ids)[None]  # (1, T)
    logits = model(x[:, :-1]).astype(mx.float32)  # (1, T-1, V)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    return math.exp(-mx.take_along_axis(logprobs, x[:, 1:, None], axis=-1).mean().item())


def normalize_sql(text: str) -> str:
    """Case, whitespace and a trailing semicolon folded."""
    return " ".join(text.strip().rstrip(";").lower().split())


def sql_exact_match(outputs: list[str], references: list[list[str]]) -> float:
    """Share of outputs equal to one of their references after `normalize_sql`."""
    hits = [
        normalize_sql(out) in {normalize_sql(r) for r in refs}
        for out, refs in zip(outputs, references, strict=True)
    ]
    return sum(hits) / len(hits) if hits else 0.0


def _sentences(text: str) -> str:
    """ROUGE-Lsum scores sentence by sentence: one sentence per line."""
    return "\n".join(s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s)


def rouge(outputs: list[str], references: list[list[str]]) -> dict[str, float]:
    """Mean ROUGE-1 and ROUGE-Lsum F1 (Porter stemmer), each output scored against the best of
    its references (multi-reference, as E2E's MR groups have several)."""
    try:
        from rouge_score import rouge_scorer
    except ImportError:
        raise SpecstreamError(
            "ROUGE needs the rouge-score package: pip install 'specstream-mlx[quality]'"
        ) from None
    scorer = rouge_scorer.RougeScorer(["rouge1", "rougeLsum"], use_stemmer=True)
    totals = {"rouge1": 0.0, "rougeLsum": 0.0}
    for out, refs in zip(outputs, references, strict=True):
        scores = scorer.score_multi([_sentences(r) for r in refs], _sentences(out))
        for key in totals:
            totals[key] += scores[key].fmeasure
    n = max(len(outputs), 1)
    return {key: value / n for key, value in totals.items()}
