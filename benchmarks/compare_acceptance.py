"""Do two acceptance.json files (`specstream calibrate --measure-acceptance`) record the same
drafts? Position by position: how many positions changed a stream's rank of the text's token,
whether the path counts and top-1 / top-3 tallies are equal, and how far stream 1's recorded
confidences moved. The check behind storing a shipped adapter's parent heads differently (as
float16: `specstream convert --heads-dtype float16`), where the tokens cannot change (the heads
only draft) but the drafts could.

    ./dev.sh python benchmarks/compare_acceptance.py --a OLD/acceptance.json \
        --b NEW/acceptance.json [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def compare(a: dict, b: dict) -> dict:
    """What differs between two acceptance statistics measured on the same prompts."""
    if a["trace"]["starts"] != b["trace"]["starts"]:
        return {"same_positions": False}
    ranks = sum(x != y for x, y in zip(a["trace"]["ranks"], b["trace"]["ranks"], strict=True))
    moved = [
        abs(x - y) for x, y in zip(a["trace"]["confidence"], b["trace"]["confidence"], strict=True)
    ]
    return {
        "same_positions": True,
        "positions": a["positions"],
        "ranks_differing": ranks,
        "counts_equal": a["counts"] == b["counts"],
        "top1": [a["top1"], b["top1"]],
        "top3": [a["top3"], b["top3"]],
        "confidence_differing": sum(m > 0 for m in moved),
        "confidence_max_change": round(max(moved, default=0.0), 6),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--a", required=True, help="an acceptance.json")
    p.add_argument("--b", required=True, help="another, measured on the same prompts")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    a, b = (json.loads(Path(f).read_text()) for f in (args.a, args.b))
    report = compare(a, b)
    if not report["same_positions"]:
        print("different positions: the two were not measured on the same decoded text")
        return 1
    print(
        f"{report['positions']} positions: {report['ranks_differing']} with a stream's rank "
        f"changed; counts {'equal' if report['counts_equal'] else 'differ'}; top-1 "
        f"{report['top1'][0]} -> {report['top1'][1]}; stream-1 confidence changed at "
        f"{report['confidence_differing']} positions, by at most {report['confidence_max_change']}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
