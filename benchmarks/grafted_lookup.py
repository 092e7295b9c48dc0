"""Prompt lookup grafted onto the streams' tree against lookup chains drafted instead of it,
paired on the same prompts in one process (issue 18): `ss+pld` as it runs now (greedy, the
streams drafting a tree: the lookup's chains grafted under the root and past the tree's deepest
path, `decoding.lookup.lookup_grafter`), `ss+pld` as it ran before (a lookup chain, when the
context has a match, verified instead of the streams' tree), `ss` and plain decoding (`ar`),
interleaved prompt by prompt so that the machine's drift falls on all of them alike.

Prints decode tokens/s per decoder (tokens after each prompt's first pass over the time after
it, summed over prompts), tau (tokens per pass), nodes per pass, the median per-prompt ratio
grafted / chains, and whether every output equals `ar`'s.

    ./dev.sh python benchmarks/grafted_lookup.py --adapter sql --suite sql
        --data ../shared/data/sql/dev.jsonl [--limit 10] [--max-tokens 96] [--rounds 1]
        [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from types import SimpleNamespace

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported
from specstream_mlx import session  # noqa: E402
from specstream_mlx.bench.suites import read_suite  # noqa: E402
from specstream_mlx.prompts import encode_prompt  # noqa: E402
from specstream_mlx.provenance import provenance  # noqa: E402
# isort: on

GRAFTED = session._with_lookup


def chains_instead(loaded, dec, tree, sampling):
    """`ss+pld` before grafting: the lookup's chains drafted instead of the streams' tree
    (what `_with_lookup` gives a sampled generation)."""
    return GRAFTED(loaded, dec, tree, SimpleNamespace(greedy=False))


METHODS = {
    "ar": ("ar", GRAFTED),
    "ss": ("ss", GRAFTED),
    "chains": ("ss+pld", chains_instead),
    "grafted": ("ss+pld", GRAFTED),
}


def run(loaded, prompt: list[int], method: str, max_tokens: int):
    decoder, lookup = METHODS[method]
    session._with_lookup = lookup
    try:
        return ss.generate(loaded, prompt, max_tokens=max_tokens, decoder=decoder)
    finally:
        session._with_lookup = GRAFTED


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapter", required=True)
    parser.add_argument("--suite", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--model", default=None)
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json")
    args = parser.parse_args()

    loaded = ss.load(args.model, args.adapter)
    questions = read_suite(args.suite, args.data, args.limit)
    prompts = [encode_prompt(loaded, q.turns[0]) for q in questions]
    for method in METHODS:  # warm-up: traces and first allocations
        run(loaded, prompts[0], method, 8)
    lookup = run(loaded, prompts[0], "grafted", 1).stats.tree
    print(f"grafted: {json.dumps(lookup)}", flush=True)
    totals = {m: [0, 0.0, 0, 0, 0] for m in METHODS}  # tokens, s, accepted, passes, nodes
    ratios, identical = [], True
    for r in range(args.rounds):
        for i, prompt in enumerate(prompts):
            order = list(METHODS) if (i + r) % 2 == 0 else list(METHODS)[::-1]
            outs = {m: run(loaded, prompt, m, args.max_tokens) for m in order}
            speeds = {}
            for m, out in outs.items():
                st, t = out.stats, totals[m]
                t[0] += st.generated_tokens - st.first_pass_tokens
                t[1] += st.wall_seconds - st.prompt_seconds
                t[2] += st.accepted_tokens
                t[3] += st.forward_passes
                t[4] += st.tree_nodes
                speeds[m] = st.tokens_per_second
            identical &= all(o.token_ids == outs["ar"].token_ids for o in outs.values())
            if speeds["chains"] > 0:
                ratios.append(speeds["grafted"] / speeds["chains"])
            print(
                f"round {r + 1} prompt {i + 1}: "
                + ", ".join(f"{m} {speeds[m]:.2f}" for m in METHODS),
                flush=True,
            )
    rows = {
        m: {
            "tokens_per_second": round(t[0] / t[1], 3) if t[1] else 0.0,
            "tau": round(t[2] / t[3], 3) if t[3] else 0.0,
            "nodes_per_pass": round(t[4] / t[3], 2) if t[3] else 0.0,
        }
        for m, t in totals.items()
    }
    ar = rows["ar"]["tokens_per_second"]
    for row in rows.values():
        row["vs_ar"] = round(row["tokens_per_second"] / ar, 3) if ar else 0.0
    out = {
        "adapter": args.adapter,
        "suite": args.suite,
        "prompts": len(prompts),
        "max_tokens": args.max_tokens,
        "rounds": args.rounds,
        "grafted_tree": lookup,
        "decoders": rows,
        "median_grafted_over_chains": round(statistics.median(ratios), 3) if ratios else None,
        "identical_to_ar": identical,
        "provenance": provenance(),
    }
    for m, row in rows.items():
        print(
            f"{m}: {row['tokens_per_second']} tokens/s, tau {row['tau']}, "
            f"{row['nodes_per_pass']} nodes a pass, {row['vs_ar']}x ar"
        )
    print(f"grafted / chains, median per prompt: {out['median_grafted_over_chains']}")
    print(f"every output equals ar's: {identical}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
