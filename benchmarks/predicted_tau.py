"""Tokens per pass that an adapter's acceptance statistics promise for each sized tree, against
the tau a CUDA validation report measured for it (`scripts/cuda_validate.sh run` with TREES:
methods `ss` for the stored 2-node tree and `ss@N`, each the N-node tree of the adapter's most
probable paths, convert/validate_cuda.py sized_tree).

    ./dev.sh python benchmarks/predicted_tau.py ADAPTER REPORT.json [ADAPTER REPORT.json ...]

The promise of a tree is 1 + the summed frequencies of its paths in acceptance.json (what the
MLX planner, decoding/plan.py, ranks trees by).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import specstream_mlx  # noqa: F401  (first: loads OpenBLAS before mlx is imported)
from specstream_mlx.decoding.plan import Acceptance, best_paths

SHIPPED = Path(specstream_mlx.__file__).parent / "adapters"


def promised(acceptance: Acceptance, nodes: int) -> float:
    paths = best_paths(acceptance, acceptance.gamma, nodes - 1)
    return 1.0 + sum(acceptance.probability(p) for p in paths)


def measured(report: dict) -> dict[int, float]:
    """Node count -> tau of the report's `ss` (2 nodes) and `ss@N` rows."""
    taus = {}
    for method in report["methods"]:
        name = method["name"]
        m = re.fullmatch(r"ss(?:@(\d+))?", name)
        if m:
            taus[int(m.group(1) or 2)] = method["mean_accepted_tokens"]
    return taus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pairs", nargs="+", help="ADAPTER REPORT.json pairs")
    args = parser.parse_args()
    if len(args.pairs) % 2:
        parser.error("give ADAPTER REPORT.json pairs")
    print("| adapter | nodes: promised / measured tau |")
    print("|---|---|")
    for adapter, report_path in zip(args.pairs[::2], args.pairs[1::2], strict=True):
        folder = Path(adapter) if Path(adapter).is_dir() else SHIPPED / adapter
        acceptance = Acceptance.read(folder)
        if acceptance is None:
            parser.error(f"{folder} has no acceptance.json")
        taus = measured(json.loads(Path(report_path).read_text()))
        cells = [f"{n}: {promised(acceptance, n):.2f} / {t:.2f}" for n, t in sorted(taus.items())]
        print(f"| {adapter} | {'; '.join(cells)} |")


if __name__ == "__main__":
    main()
