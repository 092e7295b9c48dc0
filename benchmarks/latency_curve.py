"""Forward latency of a model vs tokens processed at once (T = 1, 2, 4, ..., 64).

The curve decides how large a speculative tree can be on this machine: a tree of T nodes is worth
verifying only if its expected accepted tokens beat latency(T) / latency(1).

    ./dev.sh python benchmarks/latency_curve.py [--model M] [--precision auto|stored|...]
        [--context 128] [--repeats 10] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported
import mlx.core as mx  # noqa: E402  (after specstream_mlx on purpose)
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402
from specstream_mlx.provenance import provenance  # noqa: E402
# isort: on


def forward_ms(model, cache, tokens: mx.array, repeats: int) -> float:
    times = []
    for _ in range(repeats + 1):  # the first run warms up
        start = time.perf_counter()
        mx.eval(model(tokens[None], cache=cache))
        times.append((time.perf_counter() - start) * 1000)
        for c in cache:
            c.trim(tokens.size)
    return statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--context", type=int, default=128, help="tokens already in the KV cache")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--sizes", default="1,2,4,8,16,32,64")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    loaded = ss.load(args.model, precision=args.precision)
    model = loaded.model
    cache = make_prompt_cache(model)
    mx.eval(model(mx.arange(args.context)[None] % 1000 + 100, cache=cache))
    rows = []
    for t in [int(s) for s in args.sizes.split(",")]:
        ms = forward_ms(model, cache, mx.arange(t) % 1000 + 500, args.repeats)
        rows.append({"tokens": t, "ms": round(ms, 2)})
    base = rows[0]["ms"]
    print(
        f"model {loaded.name} | precision {loaded.precision} | device {ss.backend.device_name()}"
        f" | BLAS {ss.backend.preload_blas().library} | context {args.context}"
    )
    print("| tokens | forward ms | x T=1 | ms per token |")
    print("|---:|---:|---:|---:|")
    for row in rows:
        row["ratio"] = round(row["ms"] / base, 2)
        print(
            f"| {row['tokens']} | {row['ms']:.1f} | {row['ratio']:.2f} | "
            f"{row['ms'] / row['tokens']:.1f} |"
        )
    if args.json:
        out = {
            "model": loaded.name,
            "precision": loaded.precision,
            "context": args.context,
            "device": ss.backend.device_name(),
            "rows": rows,
            **provenance(),
        }
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
