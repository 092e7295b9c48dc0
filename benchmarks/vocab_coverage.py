"""How many of a dev set's answer tokens fall in the K most frequent answer tokens of a training
set: what a head over a restricted vocabulary (an adapter's draft vocabulary, `specstream train
--draft-vocab K`, chosen by the same function; or a draft-only guess such as the early-exit
guess of `--next-token-guess`) would miss.

    ./dev.sh python benchmarks/vocab_coverage.py --train TRAIN --dev DEV [--task T]
        [--sizes 1024 2048 4096 8192]
"""

from __future__ import annotations

import argparse

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported
import numpy as np  # noqa: E402
from specstream_mlx.training.data import draft_vocabulary, load_dataset  # noqa: E402
# isort: on


def answer_tokens(examples) -> list[int]:
    out = []
    for ex in examples:
        out += [t for t, keep in zip(ex.ids, np.asarray(ex.loss_mask, bool), strict=True) if keep]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", required=True)
    parser.add_argument("--dev", required=True)
    parser.add_argument("--task", default=None, help="the task both files are shaped for")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    args = parser.parse_args()
    tokenizer = ss.load().tokenizer
    train = load_dataset(args.train, tokenizer, 512, args.task).examples
    dev = answer_tokens(load_dataset(args.dev, tokenizer, 512, args.task).examples)
    distinct = len(set(answer_tokens(train)))
    print(f"{distinct} distinct answer tokens in {args.train}; {len(dev)} in {args.dev}")
    for k in args.sizes:
        keep = set(draft_vocabulary(train, k))
        print(f"top {k}: {sum(t in keep for t in dev) / len(dev):.4f} of the dev tokens")


if __name__ == "__main__":
    main()
