"""Decoders paired on the same prompts in one process, interleaved prompt by prompt (the order
reversed every other prompt) so that the machine's drift falls on all of them alike: the loop
and the summary that the paired benchmarks (walked_trees.py, grafted_lookup.py, chain_alone.py,
host_compaction.py) share."""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from pathlib import Path


def paired(runs: dict[str, Callable], prompts: list, max_tokens: int, rounds: int, ratio) -> dict:
    """`runs[name](prompt_ids, max_tokens)` -> a generation (`ss.generate`'s result), "ar"
    among them. Returns per decoder its decode tokens/s (tokens after each prompt's first pass
    over the time after it, summed over prompts), tau, nodes a pass and speed over `ar`; the
    median per-prompt ratio of tokens/s `ratio` = (a, b); whether every output equals `ar`'s."""
    for run in runs.values():  # warm-up: traces and first allocations
        run(prompts[0], 8)
    totals = {m: [0, 0.0, 0, 0, 0] for m in runs}  # tokens, seconds, accepted, passes, nodes
    ratios, identical = [], True
    for r in range(rounds):
        for i, prompt in enumerate(prompts):
            order = list(runs) if (i + r) % 2 == 0 else list(runs)[::-1]
            outs = {m: runs[m](prompt, max_tokens) for m in order}
            for m, out in outs.items():
                st, t = out.stats, totals[m]
                t[0] += st.generated_tokens - st.first_pass_tokens
                t[1] += st.wall_seconds - st.prompt_seconds
                t[2] += st.accepted_tokens
                t[3] += st.forward_passes
                t[4] += st.tree_nodes
            identical &= all(o.token_ids == outs["ar"].token_ids for o in outs.values())
            speeds = {m: outs[m].stats.tokens_per_second for m in runs}
            if speeds[ratio[1]] > 0:
                ratios.append(speeds[ratio[0]] / speeds[ratio[1]])
            line = ", ".join(f"{m} {speeds[m]:.2f}" for m in runs)
            print(f"round {r + 1} prompt {i + 1}: {line}", flush=True)
    rows = {m: _row(t) for m, t in totals.items()}
    ar = rows["ar"]["tokens_per_second"]
    for row in rows.values():
        row["vs_ar"] = round(row["tokens_per_second"] / ar, 3) if ar else 0.0
    for m, row in rows.items():
        print(
            f"{m}: {row['tokens_per_second']} tokens/s, tau {row['tau']}, "
            f"{row['nodes_per_pass']} nodes a pass, {row['vs_ar']}x ar"
        )
    median = round(statistics.median(ratios), 3) if ratios else None
    print(f"{ratio[0]} / {ratio[1]}, median per prompt: {median}")
    print(f"every output equals ar's: {identical}")
    return {"decoders": rows, "median_ratio": median, "identical_to_ar": identical}


def _row(t: list) -> dict:
    tokens, seconds, accepted, passes, nodes = t
    return {
        "tokens_per_second": round(tokens / seconds, 3) if seconds else 0.0,
        "tau": round(accepted / passes, 3) if passes else 0.0,
        "nodes_per_pass": round(nodes / passes, 2) if passes else 0.0,
    }


def arguments(doc: str, *more: tuple[str, str]) -> argparse.Namespace:
    """The options every paired benchmark takes, and `more` required ones: (flag, help)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    for flag, help in more:
        parser.add_argument(flag, required=True, help=help)
    parser.add_argument("--adapter", required=True)
    parser.add_argument("--suite", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--model", default=None)
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json")
    return parser.parse_args()


def suite_prompts(loaded, args: argparse.Namespace) -> list[list[int]]:
    """The first turn of each of the suite's first --limit items, encoded for `loaded`."""
    from specstream_mlx.bench.suites import read_suite
    from specstream_mlx.prompts import encode_prompt

    questions = read_suite(args.suite, args.data, args.limit)
    return [encode_prompt(loaded, q.turns[0]) for q in questions]


def report(args: argparse.Namespace, prompts: list, result: dict, ratio: str, **more) -> None:
    """Write `paired`'s `result` (--json) beside `more`, its median ratio named `median_{ratio}`,
    with the run's provenance."""
    from specstream_mlx.provenance import provenance

    extra = {
        **more,
        "decoders": result["decoders"],
        f"median_{ratio}": result["median_ratio"],
        "identical_to_ar": result["identical_to_ar"],
    }
    write(args, prompts, extra, provenance())


def write(args: argparse.Namespace, prompts: list, extra: dict, provenance: dict) -> None:
    """The run's JSON (--json): what ran, `extra` (the results), `provenance`."""
    if not args.json:
        return
    out = {
        "adapter": args.adapter,
        "suite": args.suite,
        "prompts": len(prompts),
        "max_tokens": args.max_tokens,
        "rounds": args.rounds,
        **extra,
        "provenance": provenance,
    }
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
