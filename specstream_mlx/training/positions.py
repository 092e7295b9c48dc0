"""Which positions of a training sequence carry speculative streams (mlx-free: the PyTorch path
in convert/ trains with the same choices)."""

from __future__ import annotations

import numpy as np


def stream_positions(loss_mask: np.ndarray, gamma: int) -> np.ndarray:
    """Positions whose streams have at least one target (prompt tokens need no streams)."""
    t = len(loss_mask)
    return np.array([p for p in range(t) if loss_mask[p + 2 : p + 2 + gamma].any()], dtype=int)


def segment(positions: np.ndarray, length: int, rng: np.random.RandomState) -> np.ndarray:
    """A random run of `length` consecutive stream positions (all of them when fewer): the
    paper's segment attention, which bounds the stream activations alive in one step."""
    if length <= 0 or len(positions) <= length:
        return positions
    start = rng.randint(0, len(positions) - length + 1)
    return positions[start : start + length]


def shared_stream_positions(config, loss_mask: np.ndarray) -> np.ndarray:
    """Shared mode: the positions whose streams run (and which the main stream attends to), as
    at decoding time: every position with prompt_streams, else those whose next token is a
    completion token (the last prompt token, the root of the first draft, and the completion)."""
    t = len(loss_mask)
    if config.prompt_streams:
        return np.arange(t)
    return np.nonzero(np.asarray(loss_mask, bool)[1:])[0]
