"""What the decoding loop adds to a forward pass (issue 18's target: a speculative pass of N <= 4
nodes costs at most 1.05 x plain step x forward(N) / forward(1)).

For N = 1, 2, 3, 4, 8, 16 nodes (the root and N - 1 children drafted by one untrained stream: a
static star tree) it times, interleaved over rounds, with the prompt's `--context` tokens cached:
- forward(N): the model alone over N rows, one bare pass (compiled as the loop runs it), waited for;
- pass(N): the same tree pass with its stream rows (what the loop's verifier runs), waited for;
- loop(N): ms per pass of decoding.loop with that tree (acceptance, compaction, next draft,
  reading back: everything), and the plain decoding step (N = 1 without streams).
The target's ratio, loop(N) / (plain step x forward(N) / forward(1)), is taken within each round
from timings made one after the other, and its median over rounds reported (medians of each
column drift apart on a CPU whose speed moves within minutes), with the three factors it is the
product of, each a median of the same rounds' ratios: loop(N) / pass(N) (what the loop adds to
its pass), pass(N) / forward(N) (what the stream rows add to the model's rows) and
forward(1) / plain step.

    ./dev.sh python benchmarks/loop_overhead.py [--model M] [--rounds 7] [--eager] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from specstream_mlx import calibration  # noqa: E402
from specstream_mlx.decoding.loop import Decoder, Prefill, make_cache  # noqa: E402
from specstream_mlx.decoding.passes import Passes  # noqa: E402
from specstream_mlx.decoding.tree import draft_tree  # noqa: E402
from specstream_mlx.models.arch import arch_of  # noqa: E402
from specstream_mlx.provenance import provenance  # noqa: E402
# isort: on

NODES = (1, 2, 3, 4, 8, 16)
STEPS = 12


def bare(passes: Passes, model, n: int, context: int, streams: int):
    """One pass over a star of n nodes after `context` cached tokens, waited for."""
    caches = make_cache(model)
    model(mx.arange(context)[None] + 7, cache=caches)
    mx.eval([c.state for c in caches])
    tree = draft_tree(5, [list(range(11, 10 + n))]) if n > 1 else draft_tree(5, [])

    def run():
        main, extra = passes.logits(tree, caches, streams, "one" if streams else "main")
        mx.eval(main, *([] if extra is None else [extra]))
        for c in caches:
            c.offset -= n

    return run


def loop(dec: Decoder, context: int, vocab: int):
    start = Prefill(dec, [int(t) for t in (np.arange(context) * 7 + 3) % vocab])
    return lambda: calibration.loop_ms(dec, start, STEPS, skip=3)  # the whole tree from pass 3


def timed(fn, reps: int = 1) -> float:
    start = time.perf_counter()
    for _ in range(reps):
        out = fn()
    if isinstance(out, float):
        return out
    return (time.perf_counter() - start) * 1000 / reps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--eager", action="store_true", help="passes not compiled")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    loaded = ss.load(args.model)
    arch = arch_of(loaded.model, loaded.config["model_type"])
    compiled = not args.eager
    vocab = loaded.config["vocab_size"]
    plain_passes = Passes(arch, None, compiled)
    fns = {
        ("plain", 1): loop(Decoder(loaded.model, arch, passes=plain_passes), args.context, vocab)
    }
    for n in NODES:
        dec = calibration.star_decoder(loaded, arch, n, 4, compiled)
        fns[("forward", n)] = bare(plain_passes, loaded.model, n, args.context, 0)
        fns[("pass", n)] = bare(dec.passes, loaded.model, n, args.context, 1)
        fns[("loop", n)] = loop(dec, args.context, vocab)
    for fn in fns.values():  # warm-up: traces, allocations
        timed(fn, 3)
    times = {key: [] for key in fns}
    ratios = {n: [] for n in NODES}  # loop / target, each from one round's adjacent timings
    factors = {
        n: {"loop_over_pass": [], "pass_over_forward": [], "forward1_over_plain": []} for n in NODES
    }  # loop / target is their product, round by round
    for _ in range(args.rounds):
        for n in NODES:  # this CPU drifts ~15% in minutes: time what a ratio divides together
            now = {}
            for key in (("plain", 1), ("forward", 1), ("forward", n), ("pass", n), ("loop", n)):
                now[key] = timed(fns[key], 5 if key[0] in ("forward", "pass") else 1)
                times[key].append(now[key])
            target = now[("plain", 1)] * now[("forward", n)] / now[("forward", 1)]
            ratios[n].append(now[("loop", n)] / target)
            factors[n]["loop_over_pass"].append(now[("loop", n)] / now[("pass", n)])
            factors[n]["pass_over_forward"].append(now[("pass", n)] / now[("forward", n)])
            factors[n]["forward1_over_plain"].append(now[("forward", 1)] / now[("plain", 1)])
    ms = {key: statistics.median(v) for key, v in times.items()}
    plain = ms[("plain", 1)]
    rows = []
    print(f"plain decoding step: {plain:.1f} ms ({'compiled' if compiled else 'eager'})")
    print(
        "| nodes | forward(N) ms | pass(N) ms | loop ms/pass | loop / target, median of rounds "
        "(min-max) | loop / pass | pass / forward(N) | forward(1) / plain |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for n in NODES:
        row = {
            "nodes": n,
            "forward_ms": round(ms[("forward", n)], 2),
            "pass_ms": round(ms[("pass", n)], 2),
            "loop_ms": round(ms[("loop", n)], 2),
            "target_ms": round(plain * ms[("forward", n)] / ms[("forward", 1)], 2),
            "loop_over_target": round(statistics.median(ratios[n]), 3),
            "loop_over_target_rounds": [round(r, 3) for r in ratios[n]],
            **{k: round(statistics.median(v), 3) for k, v in factors[n].items()},
        }
        rows.append(row)
        print(
            f"| {n} | {row['forward_ms']} | {row['pass_ms']} | {row['loop_ms']} | "
            f"{row['loop_over_target']:.3f} ({min(ratios[n]):.3f}-{max(ratios[n]):.3f}) | "
            f"{row['loop_over_pass']:.3f} | {row['pass_over_forward']:.3f} | "
            f"{row['forward1_over_plain']:.3f} |"
        )
    if args.json:
        report = {"model": loaded.name, "compiled": compiled, "plain_step_ms": round(plain, 2)}
        with open(args.json, "w") as f:
            json.dump({**report, "rows": rows, **provenance()}, f, indent=1)


if __name__ == "__main__":
    main()
