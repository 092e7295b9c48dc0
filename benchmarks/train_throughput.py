"""Training throughput per mode: completion-and-prompt tokens per second of the trainer's steps
on the default model, for shared mode and the next-token baseline with LoRA in every block
(--lora-layers 0) and in the top blocks only, and lossless mode for scale.

    ./dev.sh python benchmarks/train_throughput.py [--task sql] [--examples 16] [--epochs 2]
        [--lora-layers 0 8 12] [--json docs/results/train_throughput.json]

Each row trains `--epochs` passes over the same `--examples` writing-tool sequences (batch 4,
the recipe of scripts/make_task_adapter.sh: 8 MSA layers, LoRA rank 8): the first pass computes
what is frozen (lossless: the base's features; --lora-layers N: the output of the blocks below
the top N) and caches it, later passes reuse it, as a run of several epochs does. A step's time
is its own (validation excluded). Pause background jobs while it runs: it times the CPU.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported
from specstream_mlx.provenance import provenance  # noqa: E402
from specstream_mlx.streams.config import StreamConfig  # noqa: E402
from specstream_mlx.streams.lora import apply_lora, remove_lora  # noqa: E402
from specstream_mlx.streams.params import StreamParams  # noqa: E402
from specstream_mlx.training.data import load_dataset  # noqa: E402
from specstream_mlx.training.trainer import Hooks, TrainConfig, train  # noqa: E402
# isort: on

# the recipe of scripts/make_task_adapter.sh: train file under ../shared/data, max length
TASKS = {
    "sql": ("sql/train.jsonl", 320),
    "data2text": ("e2e/train.csv", 256),
    "summarize": ("dialogsum/train.jsonl", 512),
}


def run(loaded, mode: str, lora_layers: int, data, args) -> dict:
    """One row: tokens/s per epoch of `mode` with LoRA in the top `lora_layers` blocks."""
    params = None
    if mode != "next-token":
        cfg = StreamConfig(gamma=4, n_msa_layers=8, top_k=3, mode=mode)
        params = StreamParams(cfg.validate(loaded.config["num_hidden_layers"]), 576)
    if mode != "lossless":
        apply_lora(loaded.model, 8, 20.0)
    steps_per_epoch = len(data.examples) // 4
    steps = steps_per_epoch * args.epochs
    reports = []
    cfg = TrainConfig(steps=steps, batch_size=4, learning_rate=3e-3, val_every=steps,
                      checkpoint_every=steps, segment=64, lora_layers=lora_layers)  # fmt: skip
    try:
        with tempfile.TemporaryDirectory() as tmp:
            hooks = Hooks(log=lambda s: None, on_step=reports.append, log_steps=False)
            train(loaded, params, data, data.examples[:2], Path(tmp) / "a", cfg, hooks)
    finally:
        if mode != "lossless":
            remove_lora(loaded.model)
    epochs = []
    for e in range(args.epochs):
        part = reports[e * steps_per_epoch : (e + 1) * steps_per_epoch]
        tokens, seconds = sum(r.tokens for r in part), sum(r.seconds for r in part)
        epochs.append({"tokens": tokens, "seconds": round(seconds, 2),
                       "tokens_per_s": round(tokens / seconds, 1)})  # fmt: skip
    return {"mode": mode, "lora_layers": lora_layers, "epochs": epochs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="sql", choices=sorted(TASKS))
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--examples", type=int, default=16, help="a multiple of 4")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lora-layers", type=int, nargs="+", default=[0, 8, 12])
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    loaded = ss.load()
    name, max_length = TASKS[args.task]
    data = load_dataset(Path(args.data_dir) / name, loaded.tokenizer, max_length, args.task)
    data.examples = data.examples[: args.examples]
    rows = [run(loaded, "lossless", 0, data, args)]
    for mode in ("shared", "next-token"):
        rows += [run(loaded, mode, n, data, args) for n in args.lora_layers]
    print("| mode | LoRA blocks | " + " | ".join(
        f"epoch {e + 1} tokens/s" for e in range(args.epochs)) + " |")  # fmt: skip
    print("|---|---|" + "---|" * args.epochs)
    for row in rows:
        blocks = "-" if row["mode"] == "lossless" else (row["lora_layers"] or "all 30")
        cells = " | ".join(str(e["tokens_per_s"]) for e in row["epochs"])
        print(f"| {row['mode']} | {blocks} | {cells} |")
    if args.json:
        out = {"task": args.task, "examples": args.examples, "rows": rows, **provenance()}
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
