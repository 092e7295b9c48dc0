"""What a speculative pass costs as the streams' MSA layers grow, against what the latency curve
predicts. Before curve version 7 the calibration's loop passes ran their stream rows through
`msa_ref` (4) MSA layers only and `LatencyCurve.pass_ms` scaled to an adapter's depth by the
bare layer curve's row counts, which underpriced deep streams; since version 7 the loops are
timed at 4 and 16 layers too and other depths interpolated, so this checks the interpolation
(8 layers) and how far the curve has drifted since it was measured (4 and 16).

For a 2-node star (untrained streams, one stream per node, compiled) in 4 / 8 / 16 MSA layers
it times ms per pass of the decoding loop (calibration.loop_ms, 128 cached tokens), interleaved
over rounds with the plain decoding step, and prints the curve's prediction beside each (the
cached curve: run `specstream calibrate` first).

    ./dev.sh python benchmarks/msa_depth.py [--model M] [--rounds 5] [--nodes 2] [--json OUT]
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

DEPTHS = (4, 8, 16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    loaded = ss.load(args.model)
    curve = calibration.read_curve(loaded)
    if curve is None:
        raise SystemExit("msa_depth: no latency curve cached: run `specstream calibrate` first")
    arch = arch_of(loaded.model, loaded.config["model_type"])
    vocab = loaded.config["vocab_size"]
    decoders = {"plain": Decoder(loaded.model, arch, passes=Passes(arch, None, True))}
    start = Prefill(decoders["plain"], [int(t) for t in (np.arange(128) * 7 + 3) % vocab])
    depths = [d for d in DEPTHS if d < len(arch.layers)]
    for d in depths:
        decoders[d] = calibration.star_decoder(loaded, arch, args.nodes, d, True)
    times = {k: [] for k in decoders}
    for dec in decoders.values():  # warm-up: traces, allocations
        calibration.loop_ms(dec, start, 4, skip=3)
    for _ in range(args.rounds):
        for k, dec in decoders.items():
            times[k].append(calibration.loop_ms(dec, start, 12, skip=3))
    ms = {k: statistics.median(v) for k, v in times.items()}
    plain = ms["plain"]
    print(f"plain decoding step: {plain:.1f} ms (the curve's: {curve.plain_ms:.1f})")
    print("| MSA layers | loop ms/pass | x plain | curve predicts ms | x its plain |")
    print("|---|---|---|---|---|")
    rows = []
    for d in depths:
        predicted = curve.pass_ms(args.nodes, 1, d, 1)
        rows.append(
            {"msa_layers": d, "loop_ms": round(ms[d], 2), "predicted_ms": round(predicted, 2)}
        )
        print(
            f"| {d} | {ms[d]:.1f} | {ms[d] / plain:.3f} | {predicted:.1f} | "
            f"{predicted / curve.plain_ms:.3f} |"
        )
    if args.json:
        report = {"model": loaded.name, "nodes": args.nodes, "plain_step_ms": round(plain, 2)}
        report["curve_plain_ms"] = round(curve.plain_ms, 2)
        with open(args.json, "w") as f:
            json.dump({**report, "rows": rows, **provenance()}, f, indent=1)


if __name__ == "__main__":
    main()
