"""Does `mx.async_eval` return before a forward is computed? The pipelined decoding loop builds
the next pass while this one computes only as far as async_eval returns early. 1-row forwards of
the default model on its mlx-lm cache (64 tokens cached), interleaved with plain `mx.eval`s.

    ./dev.sh python benchmarks/async_probe.py [--repeats 20]
"""

import argparse
import statistics
import time

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported
import mlx.core as mx  # noqa: E402
from specstream_mlx.decoding.loop import make_cache  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args()
    model = ss.load().model
    cache = make_cache(model)
    model(mx.arange(64)[None], cache=cache)
    mx.eval([c.state for c in cache])
    token = mx.array([[1]])
    returned, waited, blocking = [], [], []
    for _ in range(args.repeats):
        out = model(token, cache=cache)
        t0 = time.perf_counter()
        mx.async_eval(out)
        t1 = time.perf_counter()
        mx.eval(out)
        t2 = time.perf_counter()
        returned.append(1000 * (t1 - t0))
        waited.append(1000 * (t2 - t1))
        out = model(token, cache=cache)
        t0 = time.perf_counter()
        mx.eval(out)
        blocking.append(1000 * (time.perf_counter() - t0))
    print(
        f"{mx.default_device()}: async_eval returns after {statistics.median(returned):.1f} ms, "
        f"then {statistics.median(waited):.1f} ms to wait; mx.eval "
        f"{statistics.median(blocking):.1f} ms (medians of {args.repeats})"
    )


if __name__ == "__main__":
    main()
