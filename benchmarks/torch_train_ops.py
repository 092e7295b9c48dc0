"""Work the PyTorch trainer issues per step: aten ops (on a GPU, roughly the kernels a step
launches, which bound a step of this small model there) and seconds on this machine, for one
shared-mode step of 4 writing-tool sequences run one pass per sequence (the trainer before
`batch_loss`) and packed into one pass (the trainer now). Default model, the writing tools'
recipe (gamma 4, 8 MSA layers, LoRA rank 8 in every block).

    PYTHONPATH=. ./dev.sh python benchmarks/torch_train_ops.py [--task sql]
        [--data ../shared/data/sql/train.jsonl]

Pause background jobs while it runs: the seconds are this CPU's.
"""

from __future__ import annotations

import argparse
import time

from torch.profiler import ProfilerActivity, profile

from convert.torch_adapter import add_lora
from convert.torch_base import load_base
from convert.torch_streams import TorchStreams, View
from convert.torch_train import Sequence, _ChatIds, batch_loss, sequence_loss
from specstream_mlx.streams.config import StreamConfig
from specstream_mlx.training.data import load_dataset


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="sql", choices=["sql", "data2text", "summarize"])
    p.add_argument("--data", default="../shared/data/sql/train.jsonl")
    args = p.parse_args()
    base = load_base()
    examples = load_dataset(args.data, _ChatIds(base.tokenizer), 512, task=args.task).examples
    examples = examples[:12]  # warm-up, profiled and timed steps: 4 sequences each
    cfg = StreamConfig(gamma=4, n_msa_layers=8, mode="shared")
    streams = TorchStreams(cfg, base.config["hidden_size"])
    add_lora(base, cfg)
    for name, param in base.model.named_parameters():
        param.requires_grad_("lora_" in name)
    view = View(base.model)

    def one_by_one(batch):
        for e in batch:
            sequence_loss(view, streams, e.ids, e.loss_mask).total.div(len(batch)).backward()

    def packed(batch):
        seqs = [Sequence(e.ids, e.loss_mask) for e in batch]
        batch_loss(view, streams, seqs).total.div(len(batch)).backward()

    print(f"sequence lengths: {[len(e.ids) for e in examples]}")
    print("| step | aten ops per step | seconds per step (this CPU) |\n|---|---:|---:|")
    for name, step in [("one pass per sequence", one_by_one), ("packed", packed)]:
        step(examples[:4])
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step(examples[4:8])
        ops = sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))
        start = time.perf_counter()
        step(examples[8:12])
        step(examples[4:8])
        print(f"| {name} | {ops:,} | {(time.perf_counter() - start) / 2:.2f} |")


if __name__ == "__main__":
    main()
