"""The parameters of token choice: greedy, or temperature with top-k / top-p, seeded. Free of
MLX, so the PyTorch path (convert/) shares them on machines without it."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import SpecstreamError


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy; top_k 0 and top_p 1 mean no truncation."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    def __post_init__(self):
        if not self.temperature >= 0:  # also rejects NaN
            raise SpecstreamError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise SpecstreamError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise SpecstreamError(f"top_k must be >= 0, got {self.top_k}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise SpecstreamError(f"seed must be in [0, 2**63), got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
