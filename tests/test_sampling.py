"""Sampling: the distribution after temperature / top-k / top-p, seeds, and bad values."""

import math

import mlx.core as mx
import pytest

import specstream_mlx as ss
from specstream_mlx.sampling import Sampler, SamplingParams, probabilities

LOGITS = mx.array([2.0, 1.0, 0.5, 0.0, -1.0])


def softmax(xs):
    z = sum(math.exp(x) for x in xs)
    return [math.exp(x) / z for x in xs]


def test_temperature_only_is_softmax():
    got = probabilities(LOGITS, SamplingParams(temperature=0.5)).tolist()
    assert got == pytest.approx(softmax([x / 0.5 for x in LOGITS.tolist()]), abs=1e-6)


def test_top_k_keeps_k_most_likely():
    got = probabilities(LOGITS, SamplingParams(temperature=1.0, top_k=2)).tolist()
    assert got[2:] == [0, 0, 0]
    assert got[:2] == pytest.approx(softmax([2.0, 1.0]), abs=1e-6)


def test_top_p_keeps_smallest_set_reaching_p():
    p = softmax(LOGITS.tolist())  # [0.53, 0.20, 0.12, 0.07, 0.03]
    got = probabilities(LOGITS, SamplingParams(temperature=1.0, top_p=0.7)).tolist()
    kept = p[:2]  # 0.53 < 0.7 <= 0.53 + 0.20
    assert got == pytest.approx([k / sum(kept) for k in kept] + [0, 0, 0], abs=1e-6)


def test_seeded_sampler_replays_and_follows_distribution():
    params = SamplingParams(temperature=1.0, seed=7)
    draws = [Sampler(params)(LOGITS).item() for _ in range(3)]
    assert len(set(draws)) == 1  # a new sampler with the same seed draws the same first token
    sampler = Sampler(params)
    counts = [0] * 5
    for _ in range(2000):
        counts[sampler(LOGITS).item()] += 1
    expected = softmax(LOGITS.tolist())
    assert [c / 2000 for c in counts] == pytest.approx(expected, abs=0.04)


def test_greedy_is_argmax():
    assert Sampler(SamplingParams())(LOGITS).item() == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(temperature=-0.1),
        dict(top_p=0.0),
        dict(top_p=1.5),
        dict(top_k=-1),
        dict(temperature=float("nan")),
    ],
)
def test_bad_values_are_clear_errors(kwargs):
    with pytest.raises(ss.SpecstreamError, match="must be"):
        SamplingParams(**kwargs)


def test_seed_reproduces_generation(tiny_folders):
    loaded = ss.load(str(tiny_folders["llama"]))
    params = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=123)
    a = ss.generate(loaded, "Tell me a story", max_tokens=16, sampling=params)
    b = ss.generate(loaded, "Tell me a story", max_tokens=16, sampling=params)
    c = ss.generate(
        loaded,
        "Tell me a story",
        max_tokens=16,
        sampling=SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=124),
    )
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids
