"""What prompt lookup proposes and what the passes cost, on a suite's prompts.

1. `ngrams`: on each prompt's own greedy decoding, at every output position, the lookup's whole
   proposal scored against the decoded text, grouped by the length of the matched n-gram: how
   often the first draft is right, and each next one once those before were right (what
   decoding/lookup.py's LookupGate learns per generation).
2. `passes`: each decoder's passes in a real generation, grouped by tree size: passes, tokens
   decided per pass, median ms (the time between two yields of `stream_generate`; pld and
   ss+pld settle every pass on the host, so that is the pass's cost).

    ./dev.sh python benchmarks/lookup_probe.py ngrams --suite chat --data ../shared/data --limit 16
    ./dev.sh python benchmarks/lookup_probe.py passes --suite sql \\
        --data ../shared/data/sql/dev.jsonl --adapter sql --limit 10 --methods pld,ss+pld,ss

Both print a table; --json OUT also writes the figures.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import time

import specstream_mlx as ss
from specstream_mlx.bench.suites import read_suite
from specstream_mlx.decoding.lookup import lookup_match
from specstream_mlx.prompts import encode_prompt


def ngrams(loaded, prompts: list[list[int]], max_tokens: int) -> dict:
    right = collections.defaultdict(lambda: [0] * 5)  # n -> proposals, right at depth 0..3
    for ids in prompts:
        text = ids + ss.generate(loaded, ids, max_tokens=max_tokens).token_ids
        for p in range(len(ids), len(text)):
            proposal, n = lookup_match(text[:p])
            if not n:
                continue
            m = 0
            while m < len(proposal) and p + m < len(text) and text[p + m] == proposal[m]:
                m += 1
            counts = right[n]
            counts[0] += 1
            for j in range(m):
                counts[1 + j] += 1
    out = {}
    for n in sorted(right):
        c = right[n]
        rates = [c[1] / c[0]] + [c[j + 1] / c[j] if c[j] else None for j in (1, 2, 3)]
        out[f"{n}-gram"] = {"proposals": c[0], "right_given_earlier_right": rates}
        shown = ", ".join("-" if r is None else f"{r:.2f}" for r in rates)
        print(f"{n}-gram match: {c[0]} proposals; draft j right given those before: {shown}")
    return out


def passes(loaded, prompts: list[list[int]], max_tokens: int, methods: list[str]) -> dict:
    out = {}
    for method in methods:
        streams = loaded.streams if "ss" in method else None
        options = dict(max_tokens=max_tokens, decoder=method, streams=streams)
        for _ in ss.stream_generate(loaded, prompts[0], **options):  # warm-up: traces
            pass
        by_size = collections.defaultdict(list)  # nodes -> (tokens, ms)
        for ids in prompts:
            nodes, last = 0, time.perf_counter()
            for i, chunk in enumerate(ss.stream_generate(loaded, ids, **options)):
                now = time.perf_counter()
                size, nodes = chunk.stats.tree_nodes - nodes, chunk.stats.tree_nodes
                if i > 0:  # the first pass includes the prefill
                    by_size[size].append((len(chunk.token_ids), (now - last) * 1000))
                last = now
        print(f"{method}:")
        out[method] = {}
        for size in sorted(by_size):
            rows = by_size[size]
            tokens = sum(t for t, _ in rows) / len(rows)
            ms = statistics.median(m for _, m in rows)
            out[method][size] = {"passes": len(rows), "tokens_per_pass": tokens, "median_ms": ms}
            shown = f"{len(rows):4d} passes, {tokens:.2f} tokens/pass, {ms:.1f} ms"
            print(f"  {size:2d} nodes: {shown}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("probe", choices=("ngrams", "passes"))
    ap.add_argument("--suite", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--adapter")
    ap.add_argument("--model")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--methods", default="pld,ss+pld")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    loaded = ss.load(args.model, adapter=args.adapter)
    questions = read_suite(args.suite, args.data, limit=args.limit)
    prompts = [encode_prompt(loaded, [{"role": "user", "content": q.turns[0]}]) for q in questions]
    if args.probe == "ngrams":
        out = ngrams(loaded, prompts, args.max_tokens)
    else:
        out = passes(loaded, prompts, args.max_tokens, args.methods.split(","))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"probe": args.probe, **vars(args), "results": out}, f, indent=2)


if __name__ == "__main__":
    main()
