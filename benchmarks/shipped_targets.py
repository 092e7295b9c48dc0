"""Issue 20's stream targets against the shipped SmolLM2 adapters, read from each adapter's own
acceptance.json (the statistics the planner uses, measured by `specstream calibrate
--measure-acceptance` on dev items 40-87 of its suite): stream-1 top-1, P(stream 2 right |
stream 1 right), and the expected tokens per pass (tau) of the best static tree of 4, 8 and 16
nodes, as benchmarks/validate_streams.py computes it. Nothing is decoded: it reads files.

    ./dev.sh python benchmarks/shipped_targets.py [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported
from specstream_mlx.streams.acceptance import Acceptance  # noqa: E402
from specstream_mlx.provenance import provenance  # noqa: E402
from validate_streams import static_taus  # noqa: E402  (this folder)

# isort: on

ADAPTERS = Path(ss.__file__).parent / "adapters"
# issue 20's targets: stream-1 top-1, P(stream 2 | stream 1 right), tau of the 8-node tree
TARGETS = {
    "chat": (0.45, 0.40, 1.8),
    "sql": (0.70, None, 2.3),
    "data2text": (0.55, None, 2.3),
    "summarize": (0.55, None, 2.3),
}


def row(name: str) -> dict:
    """One shipped adapter's figures and whether each meets its target."""
    acceptance = Acceptance.read(ADAPTERS / name)
    if acceptance is None:
        raise ss.SpecstreamError(f"{ADAPTERS / name} has no acceptance.json")
    rates = acceptance.rates()
    if rates["top1"] is None:  # statistics saved before per-stream hits were kept
        raise ss.SpecstreamError(f"{ADAPTERS / name}/acceptance.json has no per-stream top-1")
    stream1, given = rates["top1"][0], rates["top1_given_earlier_right"][1]
    taus = static_taus(acceptance, acceptance.gamma)
    low1, low2, low_tau = TARGETS[name]
    return {
        "adapter": name,
        "source": acceptance.source,
        "positions": acceptance.positions,
        "stream1_top1": stream1,
        "stream2_given_stream1_right": given,
        "tau_best_static": taus,
        "targets": {"stream1_top1": low1, "stream2_given_stream1_right": low2, "tau_8": low_tau},
        "met": stream1 >= low1 and (low2 is None or given >= low2) and taus[8] >= low_tau,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args()
    rows = [row(name) for name in TARGETS]
    print("| adapter | stream-1 top-1 | P(s2 right given s1 right) | tau 4 / 8 / 16 nodes", end="")
    print(" | targets met |")
    print("|---|---:|---:|---|---|")
    for r in rows:
        taus = " / ".join(f"{r['tau_best_static'][n]:.2f}" for n in (4, 8, 16))
        print(
            f"| {r['adapter']} | {r['stream1_top1']:.3f} | "
            f"{r['stream2_given_stream1_right']:.3f} | {taus} | {'yes' if r['met'] else 'no'} |"
        )
    if args.json:
        out = {"rows": rows, "provenance": provenance()}
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    try:
        main()
    except ss.SpecstreamError as exc:
        raise SystemExit(f"error: {exc}") from None
