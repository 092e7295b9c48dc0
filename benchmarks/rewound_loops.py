"""Whether a decoding loop timed from a rewound prefill (decoding.loop.Prefill, shared by the
latency curve's timed loops) costs what one timed from a fresh prefill does. For 2 / 3 / 4-node
stars (untrained streams in 4 MSA layers, compiled, 128 cached tokens) it times ms per pass of
the decoding loop both ways, interleaved over rounds: from a fresh prefill (as the curve did
before) and from one prefill shared by every loop, rewound for each (as the curve does now). As
in the curve, 11 passes of untrained streams (about a token each) stay within the caches' first
256 rows, so a rewind puts back only the offset. The first round is a warm-up.

    ./dev.sh python benchmarks/rewound_loops.py [--model M] [--rounds 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported
import numpy as np  # noqa: E402
from specstream_mlx import calibration  # noqa: E402
from specstream_mlx.decoding.loop import Decoder, Prefill  # noqa: E402
from specstream_mlx.decoding.passes import Passes  # noqa: E402
from specstream_mlx.models.arch import arch_of  # noqa: E402
from specstream_mlx.provenance import provenance  # noqa: E402
# isort: on

STEPS = 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    loaded = ss.load(args.model)
    arch = arch_of(loaded.model, loaded.config["model_type"])
    plain = Decoder(loaded.model, arch, passes=Passes(arch, None, True))
    prompt = [int(t) for t in (np.arange(128) * 7 + 3) % loaded.config["vocab_size"]]
    start = Prefill(plain, prompt)
    stars = {n: calibration.star_decoder(loaded, arch, n, 4, True) for n in (2, 3, 4)}
    times: dict = {}
    for round_ in range(args.rounds + 1):
        for n, dec in stars.items():
            for kind in ("fresh", "rewound"):
                # fresh: this loop's own prefill, as calibration.loop_ms had before
                own = Prefill(dec, prompt) if kind == "fresh" else start
                ms = calibration.loop_ms(dec, own, STEPS)
                if round_:
                    times.setdefault(f"{n} {kind}", []).append(round(ms, 2))
    print("| nodes | from | median ms per pass | rounds |")
    print("|---|---|---:|---|")
    for key, values in times.items():
        n, kind = key.split()
        print(f"| {n} | {kind} | {statistics.median(values):.1f} | {values} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ms": times, **provenance()}, f, indent=1)


if __name__ == "__main__":
    main()
