"""A training run's loss history as the adapter keeps it (no MLX: the PyTorch trainer, which
runs where MLX is not installed, writes the same record)."""

from __future__ import annotations


def loss_curve(history: list[dict], points: int = 40) -> list[dict]:
    """The training loss as at most `points` windows of consecutive steps: [{"steps": [first,
    last], "loss": mean}, ...] (kept with the adapter, so its curve can be plotted)."""
    size = max(1, -(-len(history) // points))
    windows = [history[i : i + size] for i in range(0, len(history), size)]
    return [
        {
            "steps": [w[0]["step"], w[-1]["step"]],
            "loss": round(sum(h["loss"] for h in w) / len(w), 4),
        }
        for w in windows
    ]
