"""What a stream head pass costs over a draft vocabulary (StreamConfig.draft_vocab) against the
whole LM head: the planner charges a head over K of the V columns K / V of the whole head's
time (calibration.plan_tree), and this checks that share on this device.

For 1 and 4 rows of normed hidden states it times, interleaved over rounds, the model's LM head
(the decoder's main-stream head) and `tree_step.DraftVocab.logits` over the K commonest ids of
--data's completions (what `specstream train --draft-vocab K` keeps), each compiled and waited
for, medians of ms over rounds.

    ./dev.sh python benchmarks/draft_head.py [--model M] [--sizes 4096,8192,16384]
        [--data ../shared/data/dialogsum/train.jsonl --task summarize] [--rounds 9] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported
import mlx.core as mx  # noqa: E402
from specstream_mlx.decoding.tree_step import DraftVocab  # noqa: E402
from specstream_mlx.models.arch import arch_of  # noqa: E402
from specstream_mlx.provenance import provenance  # noqa: E402
from specstream_mlx.streams.config import StreamConfig  # noqa: E402
from specstream_mlx.streams.params import StreamParams  # noqa: E402
from specstream_mlx.training.data import draft_vocabulary, load_dataset  # noqa: E402
# isort: on

CALLS = 20  # per timing


def timed(fn, x) -> float:
    """ms per call of `fn(x)`, waited for, over CALLS calls after a warm-up."""
    for _ in range(3):
        mx.eval(fn(x))
    start = time.perf_counter()
    for _ in range(CALLS):
        mx.eval(fn(x))
    return (time.perf_counter() - start) * 1000 / CALLS


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--sizes", default="4096,8192,16384")
    p.add_argument("--data", default="../shared/data/dialogsum/train.jsonl")
    p.add_argument("--task", default="summarize")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--json", default=None)
    args = p.parse_args()

    loaded = ss.load(args.model)
    arch = arch_of(loaded.model, loaded.config["model_type"])
    data = load_dataset(args.data, loaded.tokenizer, 512, args.task)
    heads = {"whole": mx.compile(arch.lm_head)}
    for k in (int(s) for s in args.sizes.split(",")):
        config = StreamConfig(draft_vocab=draft_vocabulary(data.examples, k))
        vocab = DraftVocab.of(arch, StreamParams(config, arch.dims))
        heads[f"K={len(config.draft_vocab)}"] = mx.compile(vocab.logits)
    times: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for rows in (1, 4):
            x = arch.norm(mx.random.normal((rows, arch.dims)))
            for name, fn in heads.items():
                times.setdefault(f"{name}, {rows} rows", []).append(timed(fn, x))
    medians = {name: round(statistics.median(ms), 3) for name, ms in times.items()}
    vocab_size = loaded.config["vocab_size"]
    for name, ms in medians.items():
        whole = medians[f"whole, {name.split(', ')[1]}"]
        k = vocab_size if name.startswith("whole") else int(name.split(",")[0][2:])
        print(
            f"{name}: {ms:.2f} ms ({ms / whole:.3f} of the whole head; K / V {k / vocab_size:.3f})"
        )
    if args.json:
        out = {"model": loaded.name, "vocab_size": vocab_size, "ms": medians, "args": vars(args)}
        with open(args.json, "w") as f:
            json.dump({**out, "provenance": provenance()}, f, indent=1)


if __name__ == "__main__":
    main()
