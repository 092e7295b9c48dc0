"""Training throughput per mode: completion-and-prompt tokens per second of the trainer's steps
on the default model, for shared mode and the next-token baseline with LoRA in every block
(--lora-layers 0) and in the top blocks only, and lossless mode for scale.

    ./dev.sh python benchmarks/train_throughput.py [--task sql] [--examples 16] [--epochs 2]
        [--lora-layers 0 8 12] [--json docs/results/train_throughput.json]
    PYTHONPATH=. ./dev.sh python benchmarks/train_throughput.py --engine torch [--device cuda]

Each row trains `--epochs` passes over the same `--examples` writing-tool sequences (batch 4,
the recipe of scripts/make_task_adapter.sh: 8 MSA layers, LoRA rank 8): the first pass computes
what is frozen (lossless: the base's features; --lora-layers N: the output of the blocks below
the top N) and caches it, later passes reuse it, as a run of several epochs does. A step's time
is its own (validation excluded). Pause background jobs while it runs: it times the CPU.

`--engine torch` times the PyTorch path's trainer (convert/torch_train.py: the same recipe, on
`--device`, CUDA where there is one) the same way, for lossless and shared mode; it caches
nothing, so its epochs cost the same, and it has no next-token baseline. Its epochs are cut at
the time its trainer logs a step, before that step's optimizer update: one AdamW update of
the streams and LoRA moves from an epoch into the next (a small share of a step).
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


def run_torch(mode: str, lora_layers: int, args) -> dict:
    """One row of the PyTorch trainer: tokens/s per epoch (a fresh base per row: its LoRA)."""
    import torch

    from convert import torch_train
    from convert.torch_adapter import add_lora
    from convert.torch_base import ChatTokenizer, load_base
    from convert.torch_streams import TorchStreams

    base = load_base(None, device=args.device)
    data = task_data(ChatTokenizer(base.tokenizer), args)
    n_layers = base.config["num_hidden_layers"]
    blocks = tuple(range(n_layers - lora_layers, n_layers)) if lora_layers else None
    cfg = StreamConfig(gamma=4, n_msa_layers=8, top_k=3, mode=mode, lora_blocks=blocks)
    torch.manual_seed(0)
    streams = TorchStreams(cfg.validate(n_layers), base.config["hidden_size"]).to(base.device)
    if mode == "shared":
        add_lora(base, cfg)
    steps_per_epoch = len(data.examples) // 4
    train_cfg = torch_train.TrainConfig(steps_per_epoch * args.epochs, 4, 3e-3, segment=64)
    rows = torch_train.train(base, streams, data.examples, train_cfg)
    tokens = sum(len(ex.ids) for ex in data.examples[: steps_per_epoch * 4])
    epochs, before = [], 0.0
    for e in range(args.epochs):
        seconds = rows[(e + 1) * steps_per_epoch - 1]["seconds"] - before
        before += seconds
        epochs.append({"tokens": tokens, "seconds": round(seconds, 2),
                       "tokens_per_s": round(tokens / seconds, 1)})  # fmt: skip
    return {"mode": mode, "lora_layers": lora_layers, "epochs": epochs}


def task_data(tokenizer, args):
    """The first --examples rows of the task's train file, in the writing tool's template."""
    name, max_length = TASKS[args.task]
    data = load_dataset(Path(args.data_dir) / name, tokenizer, max_length, args.task)
    data.examples = data.examples[: args.examples]
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="sql", choices=sorted(TASKS))
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--examples", type=int, default=16, help="a multiple of 4")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lora-layers", type=int, nargs="+", default=[0, 8, 12])
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--engine", choices=["mlx", "torch"], default="mlx")
    parser.add_argument("--device", default=None, help="--engine torch: cpu or cuda")
    args = parser.parse_args()
    if args.examples < 4 or args.examples % 4:
        parser.error("--examples must be a multiple of 4 (whole batches, every example once)")
    if args.engine == "torch":
        import torch

        args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        rows = [run_torch("lossless", 0, args)]
        rows += [run_torch("shared", n, args) for n in args.lora_layers]
    else:
        loaded = ss.load()
        data = task_data(loaded.tokenizer, args)
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
        out = {"task": args.task, "examples": args.examples, "engine": args.engine,
               "device": args.device, "rows": rows, **provenance()}  # fmt: skip
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
