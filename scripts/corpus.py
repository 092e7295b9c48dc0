"""Keep distilled answers in the repository (specstream_mlx/training/corpus.py).

    ./dev.sh python scripts/corpus.py pack   [--split train] [--rows FILE] [--corpus DIR]
    ./dev.sh python scripts/corpus.py unpack [--split train] [--rows FILE] [--corpus DIR]
                                             [--data-dir D]
    ./dev.sh python scripts/corpus.py pack|unpack --split mix [--chat-mix 2000] [--seed 0]
                                             [--mix-kinds K,K] ...

pack: the rows of FILE (default ../runs/distill/instructions_SPLIT.jsonl, for mix
../runs/distill/mix_train.jsonl) that no shard holds yet become the next shard of
corpus/smollm2-135m-instruct/ (commit it). unpack: the shards' rows that FILE lacks are appended
to it, prompts joined from ../shared/data, so that distillation resumes after them
(scripts/distill_instructions.sh unpacks first by itself). Splits train and dev answer the
instruction prompts; mix answers the chat suite's mix (`python -m convert.torch_distill
--chat-mix N --seed S`), whose prompts are rebuilt from the same N and S (`--seed 0,1`: the
mixes of both seeds, e.g. to unpack a shard distilled with seed 1 beside seed 0's). Only the mix's
permissive kinds are packed and unpacked unless --mix-kinds says otherwise (DialogSum's
dialogues are CC BY-NC-SA: training/chat_prompts.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specstream_mlx.errors import SpecstreamError
from specstream_mlx.training.chat_prompts import chat_mix_items, mix_kinds
from specstream_mlx.training.corpus import SPLITS, pack, read_shards, unpack
from specstream_mlx.training.instructions import FILE, instructions_split

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "corpus" / "smollm2-135m-instruct"


def prompt_items(args) -> list:
    """The prompts the split's rows answer, with their sources and categories."""
    if args.split == "mix":  # one mix per seed (a shard each), their union
        kinds, items = mix_kinds(args.mix_kinds), {}
        for seed in args.seed:
            for item in chat_mix_items(args.data_dir, args.chat_mix, seed, kinds):
                items.setdefault(item.prompt, item)
        return list(items.values())
    return instructions_split(args.data_dir / FILE, args.split)


def seeds(text: str) -> list[int]:
    """--seed: one seed, or a comma list (0,1) for the union of several mixes."""
    try:
        return [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a seed or a comma list of seeds: {text!r}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("pack", "unpack"))
    parser.add_argument("--split", choices=SPLITS, default="train")
    parser.add_argument("--rows", type=Path, help="the distilled rows file")
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--chat-mix", type=int, default=2000, help="mix: its N prompts")
    parser.add_argument("--seed", type=seeds, default=[0], help="mix: its shuffle (or S,S,...)")
    parser.add_argument("--mix-kinds", default=None, help="mix: all, or a comma list of kinds")
    args = parser.parse_args(argv)
    name = "mix_train" if args.split == "mix" else f"instructions_{args.split}"
    rows = args.rows or ROOT.parent / "runs" / "distill" / f"{name}.jsonl"
    try:
        items = prompt_items(args)
        if args.action == "pack":
            shard = pack(rows, args.corpus, args.split, {i.prompt for i in items})
            total = len(read_shards(args.corpus, args.split))
            print(f"{shard or 'no new rows'}; {total} {args.split} rows in {args.corpus}")
        else:
            added = unpack(args.corpus, items, args.split, rows)
            print(f"{added} rows from {args.corpus} appended to {rows}")
    except SpecstreamError as exc:
        print(f"corpus.py: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
