"""Can lossless streams memorise a handful of sequences? A fast diagnostic for stream capacity
and optimisation: train on the first N distilled rows and validate on 4 of those same rows.

    ./dev.sh python benchmarks/stream_memorise.py --data runs/chat_distill.jsonl [--rows 8]
        [--steps 160] [--lr 3e-3] [--rank 8] [--msa-layers 4] [--plain-adapter-lr]

The trainer gives the stream adapters' output matrices the stream embeddings' learning rate
(lr x the hidden state's RMS); --plain-adapter-lr restores the earlier recipe (plain lr) for
comparison. Figures: docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import tempfile

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported
import mlx.core as mx  # noqa: E402
import mlx.optimizers as optim  # noqa: E402
from specstream_mlx.streams.config import StreamConfig  # noqa: E402
from specstream_mlx.streams.params import StreamParams  # noqa: E402
from specstream_mlx.training import trainer  # noqa: E402
from specstream_mlx.training.data import load_dataset  # noqa: E402
# isort: on


def optimizer_plain_adapter_lr(cfg: trainer.TrainConfig, scale: float) -> optim.Optimizer:
    """The earlier recipe: only the stream embeddings at lr x hidden RMS."""
    return optim.MultiOptimizer(
        [trainer.adamw(cfg, cfg.learning_rate * scale), trainer.adamw(cfg, cfg.learning_rate)],
        [lambda p, _: p.endswith("stream_embeddings")],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="distilled prompt/completion jsonl")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--steps", type=int, default=160)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--plain-adapter-lr", action="store_true")
    parser.add_argument("--rank", type=int, default=8, help="stream adapter rank")
    parser.add_argument("--msa-layers", type=int, default=4)
    args = parser.parse_args()
    if args.plain_adapter_lr:
        trainer.make_optimizer = optimizer_plain_adapter_lr
    loaded = ss.load()
    with tempfile.TemporaryDirectory() as tmp:
        rows = f"{tmp}/rows.jsonl"
        with open(args.data) as f, open(rows, "w") as out:
            out.writelines(line for _, line in zip(range(args.rows), f, strict=False))
        data = load_dataset(rows, loaded.tokenizer, 256)
        mx.random.seed(0)
        params = StreamParams(
            StreamConfig(stream_adapter_rank=args.rank, n_msa_layers=args.msa_layers),
            loaded.config["hidden_size"],
        )
        cfg = trainer.TrainConfig(
            steps=args.steps,
            batch_size=2,
            learning_rate=args.lr,
            val_every=max(args.steps // 4, 1),
            checkpoint_every=10**9,
            segment=0,
        )
        trainer.train(
            loaded,
            params,
            data,
            data.examples[:4],
            f"{tmp}/adapter",
            cfg,
            hooks=trainer.Hooks(
                log=lambda s: print(s, flush=True) if s.startswith("validation") else None
            ),
        )


if __name__ == "__main__":
    main()
