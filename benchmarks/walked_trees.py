"""Trees planned from a walk of the acceptance trace against trees planned from counts, paired on
the same prompts in one process (issue 18): the adapter's calibrated plan now (its acceptance
trace walked pass by pass, a tree per bin of stream 1's confidence where that pays:
`decoding.plan.choose_walked`) and the plan its counts alone give (`choose_tree`, the planner
before), each decoded with `ss`, beside plain decoding (`ar`), interleaved prompt by prompt so
that the machine's drift falls on all three alike.

Prints decode tokens/s per decoder (tokens after each prompt's first pass over the time after
it, summed over prompts), tau (tokens per pass), the plans and their predicted speed, the
median per-prompt ratio walked / counted, and whether every output equals `ar`'s.

    ./dev.sh python benchmarks/walked_trees.py --adapter summarize --suite dialogsum
        --data ../shared/data/dialogsum/dev.jsonl [--limit 10] [--max-tokens 96] [--rounds 1]
        [--json OUT]

The adapter's acceptance.json must hold a trace (`specstream calibrate --adapter A
--measure-acceptance` writes one since 2026-11-28).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported
from specstream_mlx import calibration  # noqa: E402
from specstream_mlx.bench.suites import read_suite  # noqa: E402
from specstream_mlx.prompts import encode_prompt  # noqa: E402
from specstream_mlx.provenance import provenance  # noqa: E402
# isort: on


def plans(loaded) -> dict:
    """The calibrated plan from the counts alone and from the walked trace."""
    params = loaded.streams
    acceptance = params.acceptance
    if acceptance is None or acceptance.trace is None:
        raise ss.SpecstreamError(
            "the adapter's acceptance.json has no trace: measure it again with "
            "`specstream calibrate --adapter A --measure-acceptance`"
        )
    curve = calibration.latency_curve(loaded)
    walked = calibration.plan_tree(loaded, params, curve)
    params.acceptance = dataclasses.replace(acceptance, trace=None, gates=(), bins=None)
    counted = calibration.plan_tree(loaded, params, curve)
    params.acceptance = acceptance
    return {"counted": counted, "walked": walked}


def run(loaded, prompt: list[int], plan, max_tokens: int):
    """`ss` with `plan` (None: `ar`)."""
    if plan is None:
        return ss.generate(loaded, prompt, max_tokens=max_tokens, decoder="ar")
    key = (id(loaded.streams), calibration.curve_key(loaded))
    loaded.trees[key] = plan
    return ss.generate(loaded, prompt, max_tokens=max_tokens, decoder="ss")


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
    chosen = plans(loaded)
    for name, plan in chosen.items():
        print(f"{name}: {json.dumps(plan.to_dict())}", flush=True)
    methods = {"ar": None, **chosen}
    questions = read_suite(args.suite, args.data, args.limit)
    prompts = [encode_prompt(loaded, q.turns[0]) for q in questions]
    for method in methods.values():  # warm-up: traces and first allocations
        run(loaded, prompts[0], method, 8)
    totals = {m: [0, 0.0, 0, 0] for m in methods}  # tokens, seconds, accepted, passes
    ratios, identical = [], True
    for r in range(args.rounds):
        for i, prompt in enumerate(prompts):
            speeds = {}
            order = list(methods) if (i + r) % 2 == 0 else list(methods)[::-1]
            outs = {m: run(loaded, prompt, methods[m], args.max_tokens) for m in order}
            for m, out in outs.items():
                st = out.stats
                later = st.generated_tokens - st.first_pass_tokens
                t = totals[m]
                t[0] += later
                t[1] += st.wall_seconds - st.prompt_seconds
                t[2] += st.accepted_tokens
                t[3] += st.forward_passes
                speeds[m] = st.tokens_per_second
            identical &= all(o.token_ids == outs["ar"].token_ids for o in outs.values())
            if speeds["counted"] > 0:
                ratios.append(speeds["walked"] / speeds["counted"])
            print(
                f"round {r + 1} prompt {i + 1}: "
                + ", ".join(f"{m} {speeds[m]:.2f}" for m in methods),
                flush=True,
            )
    rows = {
        m: {
            "tokens_per_second": round(t[0] / t[1], 3) if t[1] else 0.0,
            "tau": round(t[2] / t[3], 3) if t[3] else 0.0,
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
        "plans": {m: p.to_dict() for m, p in chosen.items()},
        "decoders": rows,
        "median_walked_over_counted": round(statistics.median(ratios), 3) if ratios else None,
        "identical_to_ar": identical,
        "provenance": provenance(),
    }
    for m, row in rows.items():
        print(f"{m}: {row['tokens_per_second']} tokens/s, tau {row['tau']}, {row['vs_ar']}x ar")
    print(f"walked / counted, median per prompt: {out['median_walked_over_counted']}")
    print(f"every output equals ar's: {identical}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
