"""Adapter swap latency and memory with the AdapterManager (issue 6): swaps between resident
adapters, cold loads of each shipped adapter from its folder, and each adapter's resident bytes.

    ./dev.sh python benchmarks/adapter_swap.py [--rounds 50] [--no-keep-fused] [--json OUT.json]

A swap is `manager.activate(name)` with `name` already in memory (its fused weights put back,
or with --no-keep-fused computed again from the base, and the streams exchanged); a cold load
reads, checks and puts on an adapter that is not resident.
Medians and 90th percentiles over the rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

import specstream_mlx as ss
from specstream_mlx.manager import AdapterManager
from specstream_mlx.provenance import provenance


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--keep-fused", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    loaded = ss.load()
    manager = AdapterManager(loaded, keep_fused=args.keep_fused)
    names = manager.names()
    order = ["chat", "sql", "summarize", "data2text", "sql", "chat", "data2text", "summarize"]
    manager.times.swaps.clear()
    for _ in range(args.rounds):
        for name in order:
            manager.activate(name)
    swaps = [t * 1000 for t in manager.times.swaps]

    cold: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(max(args.rounds // 5, 3)):
        for name in names:
            fresh = AdapterManager(loaded, {}, max_resident=1)
            fresh.register(name, preload=False)  # read on first use: a cold load
            start = time.perf_counter()
            fresh.activate(name)
            cold[name].append((time.perf_counter() - start) * 1000)
            fresh.activate(None)
    manager.activate(None)

    result = {
        "swap_ms": {
            "median": round(statistics.median(swaps), 3),
            "p90": round(float(np.percentile(swaps, 90, method="higher")), 3),
            "count": len(swaps),
        },
        "cold_load_ms": {
            n: {
                "median": round(statistics.median(v), 1),
                "p90": round(float(np.percentile(v, 90, method="higher")), 1),
            }
            for n, v in cold.items()
        },
        "keep_fused": args.keep_fused,
        "resident_bytes": manager.resident(),
        **provenance(),
    }
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
