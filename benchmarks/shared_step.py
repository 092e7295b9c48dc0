"""Where a shared adapter's plain decoding step goes (issue 18: plain decoding with a shared
adapter >= 0.90x the base model's). A shared adapter's main stream attends to its own streams
in the MSA layers, so its plain step runs 1 + gamma rows there, with the stream adapters.

Times the compiled plain step (decoding.passes `next_logits`, 128 tokens cached, `--steps`
steps pipelined as in decoding, medians of `--rounds` interleaved rounds) of:
- base: the base model alone;
- adapter: the adapter as it decodes (fused LoRA, its streams and their adapters);
- no stream adapters: the same without the streams' own adapters (what they cost);
- LoRA only: the adapter's fused model without its streams (what fused LoRA costs).
With `--precision q8` (or q4) the base is quantized and the LoRA runs unfused (LoRALinear layers
on the blocks the adapter stores).

    ./dev.sh python benchmarks/shared_step.py [--adapter sql] [--precision float32] [--rounds 9]
        [--steps 100] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported
import mlx.core as mx  # noqa: E402
from specstream_mlx.decoding.loop import Decoder, prefilled  # noqa: E402
from specstream_mlx.decoding.passes import Passes, StepShape  # noqa: E402
from specstream_mlx.decoding.policy import StaticShape  # noqa: E402
from specstream_mlx.manager import AdapterManager  # noqa: E402
from specstream_mlx.models.arch import arch_of  # noqa: E402
from specstream_mlx.provenance import provenance  # noqa: E402
# isort: on

CONTEXT = 128


def step_ms(loaded, params, steps: int) -> float:
    """ms per plain step of `loaded` (with the adapter on it now) running `params`' streams,
    over `steps` steps after a 128-token prefill; traced afresh (the weights may have changed)."""
    arch = arch_of(loaded.model, loaded.config["model_type"])
    passes = Passes(arch, params, compiled=True)
    n_streams = 0 if params is None else params.config.gamma
    dec = Decoder(loaded.model, arch, params, passes=passes)
    shape = StepShape.of(StaticShape.of((), 1), params, n_streams)
    prompt = list(range(100, 100 + CONTEXT + 1))
    for count in (5, steps):  # the first run warms up
        state = prefilled(dec, prompt)
        state.root = mx.array(state.root, dtype=mx.uint32)
        state.offset = mx.array(state.caches[0].offset, dtype=mx.int32)
        state.bound = state.caches[0].offset
        mx.eval(passes.next_logits(shape, state, n_streams))  # the trace, outside the timing
        start = time.perf_counter()
        for _ in range(count):
            logits = passes.next_logits(shape, state, n_streams)
            state.root = mx.argmax(logits).astype(mx.uint32)
            mx.async_eval(state.root)
        mx.eval(state.root)
    return (time.perf_counter() - start) * 1000 / steps


def one_round(manager: AdapterManager, adapter: str, steps: int) -> dict[str, float]:
    with manager.use(None) as base:
        out = {"base": step_ms(base, None, steps)}
    with manager.use(adapter) as session:
        streams = session.streams
        bare = streams.with_config(shared_stream_adapters=False)
        out["adapter"] = step_ms(session, streams, steps)
        out["no stream adapters"] = step_ms(session, bare, steps)
        out["LoRA only"] = step_ms(session, None, steps)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapter", default="sql")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--precision", default="float32")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    loaded = ss.load(precision=args.precision)
    manager = AdapterManager(loaded)
    with manager.use(args.adapter) as session:
        cfg = session.streams.config if session.streams is not None else None
    if cfg is None or not cfg.main_needs_streams:
        raise SystemExit(f"{args.adapter}: not an adapter whose main stream reads its streams")
    rounds = [one_round(manager, args.adapter, args.steps) for _ in range(args.rounds)]
    times = {k: [r[k] for r in rounds] for k in rounds[0]}
    ms = {k: round(statistics.median(v), 2) for k, v in times.items()}
    print(
        f"{args.adapter} ({args.precision}): {cfg.gamma} streams in {cfg.n_msa_layers} MSA "
        f"layers; ms per plain step, medians of {args.rounds} rounds of {args.steps} steps "
        f"({CONTEXT} cached)"
    )
    print("| step | ms | base / this |")
    print("|---|---:|---:|")
    for name, value in ms.items():
        print(f"| {name} | {value} | {ms['base'] / value:.3f} |")
    if args.json:
        record = {
            "adapter": args.adapter,
            "precision": args.precision,
            "gamma": cfg.gamma,
            "n_msa_layers": cfg.n_msa_layers,
            "rounds": args.rounds,
            "steps": args.steps,
            "ms": ms,
            "all_ms": {k: [round(x, 2) for x in v] for k, v in times.items()},
            **provenance(),
        }
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
