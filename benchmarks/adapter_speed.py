"""Speed and tau of a stream adapter on held-out prompts: plain decoding vs Speculative
Streaming with several tree shapes, interleaved per prompt; every ss output is checked equal to
plain decoding's.

    ./dev.sh python benchmarks/adapter_speed.py --adapter chat [--prompts 24] [--max-tokens 96]
        [--trees 1,2,3] [--data ../shared/data] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from dataclasses import replace
from pathlib import Path

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported
from specstream_mlx.training.chat_prompts import build_chat_prompts  # noqa: E402
# isort: on


def timed(loaded, prompt, max_tokens, decoder, streams=None):
    start = time.perf_counter()
    result = ss.generate(loaded, prompt, max_tokens=max_tokens, decoder=decoder, streams=streams)
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapter", default="chat")
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--trees", default="1,2,3", help="tree top-k values to compare")
    default_data = Path(__file__).resolve().parents[2] / "shared" / "data"
    parser.add_argument("--data", default=os.environ.get("SPECSTREAM_DATA", default_data))
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    loaded = ss.load(adapter=args.adapter)
    trained = loaded.streams
    prompts = build_chat_prompts(args.data, args.prompts, seed=1, split="dev")
    variants = {f"ss k={k}": replace(trained.config, top_k=int(k)) for k in args.trees.split(",")}
    ratios = {name: [] for name in variants}
    taus = {name: [] for name in variants}
    walls = {"ar": [], **{name: [] for name in variants}}
    timed(loaded, prompts[0], 8, "ar")  # warm-up
    for prompt in prompts:
        plain, ar_wall = timed(loaded, prompt, args.max_tokens, "ar")
        walls["ar"].append(ar_wall)
        for name, config in variants.items():
            trained.config = config
            spec, wall = timed(loaded, prompt, args.max_tokens, "ss", trained)
            if spec.token_ids != plain.token_ids:
                raise SystemExit(f"{name}: output differs from plain decoding on {prompt!r}")
            ratios[name].append(ar_wall / wall)
            taus[name].append(spec.stats.mean_accepted_tokens)
            walls[name].append(wall)
    print(
        f"adapter {args.adapter} | default model float32 | {ss.backend.device_name()} | "
        f"{len(prompts)} held-out prompts (dev splits + unseen instructions) | "
        f"max {args.max_tokens} tokens | outputs identical to ar"
    )
    print("| method | mean tau | median speedup vs ar | total seconds |")
    print("|---|---:|---:|---:|")
    rows = [{"method": "ar", "tau": 1.0, "speedup": 1.0, "seconds": round(sum(walls["ar"]), 1)}]
    for name in variants:
        rows.append(
            {
                "method": name,
                "tau": round(statistics.mean(taus[name]), 3),
                "speedup": round(statistics.median(ratios[name]), 3),
                "seconds": round(sum(walls[name]), 1),
            }
        )
    for r in rows:
        print(f"| {r['method']} | {r['tau']} | {r['speedup']} | {r['seconds']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "machine": platform.platform(),
                    "adapter": args.adapter,
                    "prompts": len(prompts),
                    "max_tokens": args.max_tokens,
                    "rows": rows,
                },
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
