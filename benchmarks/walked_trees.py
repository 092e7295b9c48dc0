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

import dataclasses
import json
from functools import partial

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported
from specstream_mlx import calibration  # noqa: E402

# isort: on
from paired import arguments, paired, report, suite_prompts  # noqa: E402


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


def run(loaded, prompt: list[int], max_tokens: int, plan=None):
    """`ss` with `plan` (None: `ar`)."""
    if plan is None:
        return ss.generate(loaded, prompt, max_tokens=max_tokens, decoder="ar")
    key = (id(loaded.streams), calibration.curve_key(loaded))
    loaded.trees[key] = plan
    return ss.generate(loaded, prompt, max_tokens=max_tokens, decoder="ss")


def main() -> None:
    args = arguments(__doc__)
    loaded = ss.load(args.model, args.adapter)
    chosen = plans(loaded)
    for name, plan in chosen.items():
        print(f"{name}: {json.dumps(plan.to_dict())}", flush=True)
    methods = {"ar": None, **chosen}
    prompts = suite_prompts(loaded, args)
    runs = {m: partial(run, loaded, plan=plan) for m, plan in methods.items()}
    result = paired(runs, prompts, args.max_tokens, args.rounds, ("walked", "counted"))
    shown = {m: p.to_dict() for m, p in chosen.items()}
    report(args, prompts, result, "walked_over_counted", plans=shown)


if __name__ == "__main__":
    main()
