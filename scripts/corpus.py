"""Keep the distilled instruction answers in the repository (specstream_mlx/training/corpus.py).

    ./dev.sh python scripts/corpus.py pack   [--split train] [--rows FILE] [--corpus DIR]
    ./dev.sh python scripts/corpus.py unpack [--split train] [--rows FILE] [--corpus DIR]
                                             [--data-dir D]

pack: the rows of FILE (default ../runs/distill/instructions_SPLIT.jsonl) that no shard holds
yet become the next shard of corpus/smollm2-135m-instruct/ (commit it). unpack: the shards'
rows that FILE lacks are appended to it, prompts joined from the instructions file, so that
scripts/distill_instructions.sh resumes after them (it unpacks first by itself).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specstream_mlx.errors import SpecstreamError
from specstream_mlx.training.corpus import pack, read_shards, unpack
from specstream_mlx.training.instructions import FILE

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "corpus" / "smollm2-135m-instruct"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("pack", "unpack"))
    parser.add_argument("--split", choices=("train", "dev"), default="train")
    parser.add_argument("--rows", type=Path, help="the distilled rows file")
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    args = parser.parse_args(argv)
    rows = args.rows or ROOT.parent / "runs" / "distill" / f"instructions_{args.split}.jsonl"
    try:
        if args.action == "pack":
            shard = pack(rows, args.corpus, args.split)
            total = len(read_shards(args.corpus, args.split))
            print(f"{shard or 'no new rows'}; {total} {args.split} rows in {args.corpus}")
        else:
            added = unpack(args.corpus, args.data_dir / FILE, args.split, rows)
            print(f"{added} rows from {args.corpus} appended to {rows}")
    except SpecstreamError as exc:
        print(f"corpus.py: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
