"""The trees the planner picks from a saved latency curve, without timing anything: each adapter's
plan from the curve of a `specstream calibrate --json` file, as measured (its drift) and as if it
had not drifted, to see what the drift margin (calibration.required_gain) changes.

    ./dev.sh python benchmarks/replan.py docs/results/calibration_lora16.json \
        sql data2text summarize
"""

from __future__ import annotations

import argparse
import json

import specstream_mlx as ss
from specstream_mlx import calibration


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("calibration", help="a `specstream calibrate --json` output file")
    p.add_argument("adapters", nargs="+", help="adapter names or folders (with acceptance.json)")
    p.add_argument("--model", default="smollm2-135m-instruct")
    args = p.parse_args()
    saved = json.load(open(args.calibration))["curve"]
    print("| adapter | curve drift | bar | nodes | predicted speedup |\n|---|---:|---:|---:|---:|")
    for name in args.adapters:
        loaded = ss.load(args.model, adapter=name)
        for drift in sorted({0.0, saved["drift"]}):
            curve = calibration.LatencyCurve(**{**saved, "drift": drift})
            plan = calibration.plan_tree(loaded, loaded.streams, curve)
            print(
                f"| {name} | {drift:.3f} | {plan.min_gain:.3f} | {plan.nodes} | "
                f"{plan.predicted_speedup:.3f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
