"""Shared-mode adapters fused against unfused: swap time, memory, and plain decoding speed with
the adapter on (issue 18: >= 0.90x the base model's plain decoding, LoRA <= 3% of it).

For each way (fused: W0 + s * (a @ b)^T computed from the untouched base at every swap;
unfused: mlx-lm LoRALinear layers whose tensors are swapped) it cycles the shipped writing-tool
adapters on one AdapterManager (`--cycles` rounds of sql, data2text, summarize, none), then
decodes `--prompts` sql dev prompts plainly (decoder ar, greedy, `--max-tokens`) with no adapter
and with `sql` on, interleaved, and reports median swap ms, peak memory and tokens/s.

    ./dev.sh python benchmarks/fused_lora.py [--cycles 5] [--prompts 4] [--max-tokens 64]
        [--data ../shared/data] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported
import mlx.core as mx  # noqa: E402
from specstream_mlx.manager import AdapterManager  # noqa: E402
from specstream_mlx.provenance import provenance  # noqa: E402
from specstream_mlx.streams import adapter_io  # noqa: E402
from specstream_mlx.tasks import read_task_examples  # noqa: E402
# isort: on

ADAPTERS = ("sql", "data2text", "summarize", None)


def run(way: str, loaded, prompts: list, cycles: int, max_tokens: int) -> dict:
    real = adapter_io.can_fuse
    adapter_io.can_fuse = real if way == "fused" else (lambda model, lora: False)
    try:
        manager = AdapterManager(loaded)
        mx.reset_peak_memory()
        swaps = []
        for _ in range(cycles):
            for name in ADAPTERS:
                start = time.perf_counter()
                manager.activate(name)
                swaps.append((time.perf_counter() - start) * 1000)
        peak_swaps = mx.get_peak_memory() / 2**20
        speeds: dict = {"base": [], "sql": []}
        for prompt in prompts:
            for name in ("base", "sql"):
                with manager.use(None if name == "base" else "sql") as model:
                    r = ss.generate(model, prompt, max_tokens=max_tokens)
                speeds[name].append(r.stats.tokens_per_second)
        manager.activate(None)
    finally:
        adapter_io.can_fuse = real
    base, sql = statistics.median(speeds["base"]), statistics.median(speeds["sql"])
    return {
        "way": way,
        "swap_ms_median": round(statistics.median(swaps), 1),
        "swap_ms_max": round(max(swaps), 1),
        "peak_memory_mb": round(peak_swaps, 1),
        "base_tokens_per_second": round(base, 2),
        "sql_tokens_per_second": round(sql, 2),
        "sql_over_base": round(sql / base, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_data = os.environ.get(
        "SPECSTREAM_DATA", Path(__file__).resolve().parents[2] / "shared/data"
    )
    parser.add_argument("--data", default=str(default_data))
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    loaded = ss.load()
    examples = read_task_examples("sql", Path(args.data) / "sql" / "dev.jsonl", args.prompts)
    prompts = [ex.prompt for ex in examples]
    results = [
        run(way, loaded, prompts, args.cycles, args.max_tokens) for way in ("fused", "unfused")
    ]
    print("| LoRA | swap ms (median / max) | peak MB | base tok/s | sql ar tok/s | sql / base |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['way']} | {r['swap_ms_median']} / {r['swap_ms_max']} | {r['peak_memory_mb']} | "
            f"{r['base_tokens_per_second']} | {r['sql_tokens_per_second']} | {r['sql_over_base']} |"
        )
    if args.json:
        out = {"rows": results, **provenance()}
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
