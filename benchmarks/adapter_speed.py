"""Speed, tau and (for writing tools) quality of a stream adapter on held-out prompts: plain
decoding vs Speculative Streaming with several tree shapes, interleaved per prompt; every ss output
is checked equal to the adapter's own plain decoding.

    ./dev.sh python benchmarks/adapter_speed.py --adapter chat [--prompts 24] [--max-tokens 96]
        [--trees 1x4,2x8,3x32] [--data ../shared/data] [--json OUT]
    ./dev.sh python benchmarks/adapter_speed.py --adapter sql --task sql --prompts 24
        [--baseline runs/sql_next_token]

Without --task the prompts are the held-out chat mix (dev splits, unseen instructions); with
--task they are the task's dev split in the writing tool's template. A tree "KxN" takes K tokens
per stream and keeps at most N nodes. A shared-mode adapter changes the model, so its plain
decoding ("ar (adapter)") runs its streams; the base model's plain decoding ("ar (base)") is
timed too, and speedups are reported against the first row. --baseline adds the plain decoding
of a next-token LoRA adapter (`specstream train --mode next-token`, same data and budget).
Quality: exact match for sql (whitespace and case folded); ROUGE-1 / ROUGE-Lsum F1 against the
best reference for summarize and data2text (E2E: every reference of the MR).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported
from specstream_mlx.metrics import rouge, sql_exact_match  # noqa: E402
from specstream_mlx.provenance import provenance  # noqa: E402
from specstream_mlx.tasks import read_task_examples  # noqa: E402
from specstream_mlx.training.chat_prompts import build_chat_prompts  # noqa: E402
# isort: on

TASK_FILES = {
    "summarize": "dialogsum/dev.jsonl",
    "data2text": "e2e/dev.csv",
    "sql": "sql/dev.jsonl",
}


def timed(loaded, prompt, max_tokens, decoder, streams=None):
    start = time.perf_counter()
    result = ss.generate(loaded, prompt, max_tokens=max_tokens, decoder=decoder, streams=streams)
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapter", default="chat")
    parser.add_argument("--task", default=None, choices=sorted(TASK_FILES))
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument(
        "--trees",
        default="1x5,2x8,3x32",
        help="K tokens per stream x N nodes, comma-separated; none: plain decoding only (quality)",
    )
    default_data = Path(__file__).resolve().parents[2] / "shared" / "data"
    parser.add_argument("--data", default=os.environ.get("SPECSTREAM_DATA", default_data))
    parser.add_argument("--json", default=None)
    parser.add_argument("--baseline", default=None, help="next-token LoRA adapter folder")
    args = parser.parse_args()

    loaded = ss.load(adapter=args.adapter)
    trained = loaded.streams
    shared = trained.config.mode == "shared"
    base = ss.load() if shared else loaded
    if args.task:
        examples = read_task_examples(args.task, Path(args.data) / TASK_FILES[args.task])
        examples = examples[: args.prompts]
        prompts, references = [e.prompt for e in examples], [e.references for e in examples]
    else:
        prompts = build_chat_prompts(args.data, args.prompts, seed=1, split="dev")
        references = None
    variants = {}
    for tree in [] if args.trees == "none" else args.trees.split(","):
        k, n = (int(x) for x in tree.split("x"))
        variants[f"ss k={k} nodes<={n}"] = replace(trained.config, top_k=k, max_tree_nodes=n)
    names = ["ar (base)", "ar (adapter)", *variants] if shared else ["ar", *variants]
    baseline = ss.load(adapter=args.baseline) if args.baseline else None
    if baseline is not None:
        names.append("ar (next-token LoRA baseline)")
    walls = {name: [] for name in names}
    taus = {name: [] for name in names}
    outputs = {name: [] for name in names}
    timed(base, prompts[0], 8, "ar")  # warm-up
    timed(loaded, prompts[0], 8, "ar")
    for prompt in prompts:
        if shared:
            result, wall = timed(base, prompt, args.max_tokens, "ar")
            walls["ar (base)"].append(wall)
            taus["ar (base)"].append(1.0)
            outputs["ar (base)"].append(result.text)
        reference_name = "ar (adapter)" if shared else "ar"
        plain, wall = timed(loaded, prompt, args.max_tokens, "ar")
        walls[reference_name].append(wall)
        taus[reference_name].append(plain.stats.mean_accepted_tokens)
        outputs[reference_name].append(plain.text)
        for name, config in variants.items():
            trained.config = config
            spec, wall = timed(loaded, prompt, args.max_tokens, "ss", trained)
            if spec.token_ids != plain.token_ids:
                raise SystemExit(f"{name}: output differs from plain decoding on {prompt!r}")
            walls[name].append(wall)
            taus[name].append(spec.stats.mean_accepted_tokens)
            outputs[name].append(spec.text)
        if baseline is not None:
            result, wall = timed(baseline, prompt, args.max_tokens, "ar")
            walls[names[-1]].append(wall)
            taus[names[-1]].append(1.0)
            outputs[names[-1]].append(result.text)

    def quality(name):
        if args.task == "sql":
            return round(sql_exact_match(outputs[name], references), 3)
        if args.task:
            return {k: round(v, 4) for k, v in rouge(outputs[name], references).items()}
        return None

    source = f"dev split of {args.task}" if args.task else "chat mix: dev splits, new instructions"
    print(
        f"adapter {args.adapter} ({trained.config.mode}) | default model float32 | "
        f"{ss.backend.device_name()} | {len(prompts)} held-out prompts ({source})"
        f" | max {args.max_tokens} tokens | ss outputs identical to the adapter's plain decoding"
    )
    first = names[0]
    print(f"| method | mean tau | median speedup vs {first} | total seconds | quality |")
    print("|---|---:|---:|---:|---:|")
    rows = []
    for name in names:
        ratios = [a / b for a, b in zip(walls[first], walls[name], strict=True)]
        rows.append(
            {
                "method": name,
                "tau": round(statistics.mean(taus[name]), 3),
                "speedup": round(statistics.median(ratios), 3),
                "seconds": round(sum(walls[name]), 1),
                "quality": quality(name),
            }
        )
        r = rows[-1]
        print(f"| {name} | {r['tau']} | {r['speedup']} | {r['seconds']} | {r['quality']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "adapter": args.adapter,
                    "mode": trained.config.mode,
                    "task": args.task,
                    "prompts": len(prompts),
                    "max_tokens": args.max_tokens,
                    "quality_metric": {"sql": "exact match", None: None}.get(
                        args.task, "ROUGE-1 / ROUGE-Lsum F1, best reference"
                    ),
                    "baseline": args.baseline,
                    "rows": rows,
                    **provenance(),
                },
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
