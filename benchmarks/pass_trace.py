"""Where a decoder's time goes, pass by pass: its passes grouped by tree size, with the tokens
each decided and the wall time each took, on a benchmark suite's prompts.

Each decoder (`--methods`) decodes the same prompts greedily, one after another; every pass but
the first of each prompt (it holds the prefill) is timed from the decoder's previous yield to
this one, so a row's ms/pass includes the loop's host work. Passes are grouped by the nodes
they verified: with `ss+pld` a chain of lookup drafts has 2-5 nodes and the streams' tree its
calibrated size, so the groups show which kind of pass pays.

    ./dev.sh python benchmarks/pass_trace.py --suite sql --data ../shared/data/sql/dev.jsonl \
        --adapter sql [--methods pld,ss+pld,ss,ar] [--limit 10] [--max-tokens 96] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported
from specstream_mlx.bench.suites import read_suite  # noqa: E402
from specstream_mlx.generate import encode_prompt, stream_generate  # noqa: E402
from specstream_mlx.provenance import provenance  # noqa: E402
# isort: on


def trace(loaded, prompts: list[list[int]], decoder: str, max_tokens: int) -> dict:
    """(nodes, tokens, ms) of every pass after the first of each prompt, and what ran."""
    passes, ran, tree = [], None, None
    for ids in prompts:
        nodes_before, last = 0, time.perf_counter()
        chunks = stream_generate(loaded, ids, max_tokens=max_tokens, decoder=decoder)
        for i, chunk in enumerate(chunks):
            now = time.perf_counter()
            nodes = chunk.stats.tree_nodes - nodes_before
            nodes_before, ran, tree = chunk.stats.tree_nodes, chunk.stats.decoder, chunk.stats.tree
            if i:
                passes.append((nodes, len(chunk.token_ids), (now - last) * 1000))
            last = now
    return {"decoder": decoder, "ran": ran, "tree": tree, "passes": passes}


def by_size(passes: list[tuple[int, int, float]]) -> list[dict]:
    groups = defaultdict(list)
    for nodes, tokens, ms in passes:
        groups[nodes].append((tokens, ms))
    rows = []
    for nodes in sorted(groups):
        tokens = sum(t for t, _ in groups[nodes])
        ms = sum(m for _, m in groups[nodes])
        count = len(groups[nodes])
        rows.append({"nodes": nodes, "passes": count, "tokens_per_pass": tokens / count,
                     "ms_per_pass": ms / count, "ms_per_token": ms / max(tokens, 1)})  # fmt: skip
    return rows


def report(t: dict) -> None:
    tokens = sum(p[1] for p in t["passes"])
    ms = sum(p[2] for p in t["passes"])
    print(f"{t['decoder']} (ran {t['ran']}): {len(t['passes'])} passes, {tokens} tokens, "
          f"{tokens / ms * 1000:.2f} tokens/s after the first pass of each prompt")  # fmt: skip
    if t["tree"]:
        print(f"tree: {json.dumps(t['tree'])}")
    print("| nodes | passes | tokens/pass | ms/pass | ms/token |\n|---:|---:|---:|---:|---:|")
    for r in by_size(t["passes"]):
        print(f"| {r['nodes']} | {r['passes']} | {r['tokens_per_pass']:.2f} | "
              f"{r['ms_per_pass']:.1f} | {r['ms_per_token']:.1f} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--adapter", default=None)
    parser.add_argument("--suite", default="sql")
    parser.add_argument("--data", default="../shared/data/sql/dev.jsonl")
    parser.add_argument("--methods", default="pld,ss+pld,ss,ar")
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    loaded = ss.load(args.model, adapter=args.adapter)
    questions = read_suite(args.suite, args.data, args.limit)
    prompts = [encode_prompt(loaded, [{"role": "user", "content": q.turns[0]}]) for q in questions]
    traces = []
    for decoder in args.methods.split(","):
        traces.append(trace(loaded, prompts, decoder, args.max_tokens))
        report(traces[-1])
    if args.json:
        out = {
            "args": vars(args),
            "traces": [{**t, "by_nodes": by_size(t["passes"])} for t in traces],
        }
        with open(args.json, "w") as f:
            json.dump({**out, **provenance()}, f, indent=1)


if __name__ == "__main__":
    main()
