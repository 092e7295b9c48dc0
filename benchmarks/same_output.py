"""Do two adapter folders decode the same? Plain greedy decoding (`ar`) of a suite's first prompts
with each, token by token: the check behind storing a shipped adapter differently (its LoRA as
float16: `specstream convert --lora-dtype float16`), where "changes no output" is the bar.

    ./dev.sh python benchmarks/same_output.py --a FOLDER --b FOLDER --suite sql \
        --data ../shared/data/sql/dev.jsonl [--limit 16] [--max-tokens 64] [--json OUT.json]

Prints, and writes with --json, the prompts decoded, how many gave identical tokens, and for the
others the first position where they differ.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import specstream_mlx as ss
from specstream_mlx.bench.suites import SUITES, read_suite
from specstream_mlx.provenance import provenance


def decode_all(loaded, folder: str, prompts: list[str], max_tokens: int) -> list[list[int]]:
    ss.use_adapter(loaded, folder)
    return [ss.generate(loaded, p, max_tokens=max_tokens, decoder="ar").token_ids for p in prompts]


def first_difference(a: list[int], b: list[int]) -> int | None:
    if a == b:
        return None
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--a", required=True, help="adapter folder or shipped name")
    p.add_argument("--b", required=True, help="adapter folder or shipped name")
    p.add_argument("--suite", required=True, choices=sorted(SUITES))
    p.add_argument("--data", required=True, help="the suite's file (the data folder for chat)")
    p.add_argument("--model", default=None)
    p.add_argument("--limit", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    prompts = [q.turns[0] for q in read_suite(args.suite, args.data, args.limit)]
    loaded = ss.load(args.model)
    a = decode_all(loaded, args.a, prompts, args.max_tokens)
    b = decode_all(loaded, args.b, prompts, args.max_tokens)
    diffs = [first_difference(x, y) for x, y in zip(a, b, strict=True)]
    report = {
        "a": args.a,
        "b": args.b,
        "suite": args.suite,
        "prompts": len(prompts),
        "max_tokens": args.max_tokens,
        "identical": sum(d is None for d in diffs),
        "tokens_a": sum(map(len, a)),
        "first_difference": {str(i): d for i, d in enumerate(diffs) if d is not None},
        "provenance": provenance(),
    }
    print(
        f"{report['identical']} of {len(prompts)} prompts identical "
        f"({report['tokens_a']} tokens with --a); differing: {report['first_difference'] or 'none'}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
