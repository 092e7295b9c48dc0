"""How soon `mx.async_eval` returns on this device: the decoding loop queues the next pass
after `async_eval` of this one, so the host's work overlaps only what is still queued then
(docs/BENCHMARKS.md, "The loop's overhead paired within rounds"; on MLX's CPU backend it
returns near the end of a pass).

For chains of 20 / 100 / 1,000 small element-wise ops and for one-row forward passes of the
model with 64 tokens cached: ms until `async_eval` returned, then ms that `eval` still waited
(medians of `--rounds`).

    ./dev.sh python benchmarks/async_eval_return.py [--model M] [--rounds 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported
import mlx.core as mx  # noqa: E402
from specstream_mlx.decoding.loop import make_cache  # noqa: E402
from specstream_mlx.provenance import provenance  # noqa: E402
# isort: on


def chain(x: mx.array, n: int) -> mx.array:
    for _ in range(n):
        x = mx.tanh(x) + 1e-3
    return x


def returned(make) -> tuple[float, float]:
    """ms until async_eval of make()'s graph returned, and ms eval waited after it."""
    out = make()
    start = time.perf_counter()
    mx.async_eval(out)
    back = time.perf_counter()
    mx.eval(out)
    return (back - start) * 1000, (time.perf_counter() - back) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    loaded = ss.load(args.model)
    small = mx.random.normal((64, 64))
    caches = make_cache(loaded.model)
    loaded.model(mx.arange(64)[None], cache=caches)
    mx.eval(small, [c.state for c in caches])
    cases = {f"{n} small ops": (lambda n=n: chain(small, n)) for n in (20, 100, 1000)}
    cases["one-row forward"] = lambda: loaded.model(mx.array([[5]]), cache=caches)
    rows = []
    for name, make in cases.items():
        returned(make)  # warm-up
        times = [returned(make) for _ in range(args.rounds)]
        row = {
            "case": name,
            "async_eval_returned_ms": round(statistics.median(t[0] for t in times), 2),
            "then_waited_ms": round(statistics.median(t[1] for t in times), 2),
        }
        rows.append(row)
        print(
            f"{name}: async_eval returned after {row['async_eval_returned_ms']} ms, "
            f"eval waited {row['then_waited_ms']} ms more"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": loaded.name, "rows": rows, **provenance()}, f, indent=1)


if __name__ == "__main__":
    main()
