"""Plain decoding speed: specstream's `ar` decoder vs mlx-lm's own generate, in one run.

mlx-lm runs the folder written by `specstream export-model` (what `mlx_lm.generate --model DIR`
loads), both as stored (Q4_1 -> MLX 4/8-bit) and dequantized to float32, in this same process, so
it gets the same OpenBLAS. Runs are interleaved (A B C A B C ...) so machine drift cancels.
Decode speed is measured identically for all: tokens after the first / time after the first token.

    ./dev.sh python benchmarks/plain_vs_mlx_lm.py [--max-tokens 128] [--rounds 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported
from mlx_lm import load as mlx_lm_load  # noqa: E402
from mlx_lm import stream_generate as mlx_lm_stream_generate  # noqa: E402
from mlx_lm.sample_utils import make_sampler  # noqa: E402
# isort: on

from specstream_mlx.generate import encode_prompt  # noqa: E402
from specstream_mlx.models.gguf import convert_gguf  # noqa: E402
from specstream_mlx.models.loader import default_gguf_path  # noqa: E402
from specstream_mlx.provenance import provenance  # noqa: E402

PROMPT = "Write a long, detailed story about a lighthouse keeper who finds a message in a bottle."


def time_tokens(token_iter) -> tuple[int, float]:
    """(tokens, decode tokens/s) where speed counts tokens after the first over time after it."""
    n, first = 0, None
    for _ in token_iter:
        n += 1
        if first is None:
            first = time.perf_counter()
    return n, (n - 1) / (time.perf_counter() - first)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp())
    gguf = default_gguf_path()
    folders = {d: convert_gguf(gguf, work / d, dtype=d) for d in ("stored", "float32")}
    ours = {p: ss.load(precision=p) for p in ("float32", "stored")}
    prompt = encode_prompt(ours["float32"], PROMPT)
    theirs = {d: mlx_lm_load(str(f)) for d, f in folders.items()}

    def run_ours(precision):
        chunks = ss.stream_generate(ours[precision], prompt, max_tokens=args.max_tokens, chat=False)
        return time_tokens(t for c in chunks for t in c.token_ids)

    def run_mlx_lm(dtype):
        model, tokenizer = theirs[dtype]
        responses = mlx_lm_stream_generate(
            model, tokenizer, prompt, max_tokens=args.max_tokens, sampler=make_sampler(0.0)
        )
        return time_tokens(r for r in responses if r.finish_reason != "stop")

    methods = {
        "specstream ar, float32": lambda: run_ours("float32"),
        "mlx-lm generate, float32 export": lambda: run_mlx_lm("float32"),
        "specstream ar, stored Q4_1 (4/8-bit)": lambda: run_ours("stored"),
        "mlx-lm generate, stored export (4/8-bit)": lambda: run_mlx_lm("stored"),
    }
    for fn in methods.values():  # warm-up
        fn()
    speeds = {name: [] for name in methods}
    tokens = {}
    for _ in range(args.rounds):
        for name, fn in methods.items():
            n, tps = fn()
            speeds[name].append(tps)
            tokens[name] = n
    print(
        f"default model | prompt {len(prompt)} tokens | max {args.max_tokens} new | "
        f"{args.rounds} interleaved rounds | {ss.backend.device_name()} | "
        f"BLAS {ss.backend.preload_blas().library}"
    )
    print("| method | tokens | decode tokens/s (median) | all rounds |")
    print("|---|---:|---:|---|")
    rows = []
    for name in methods:
        med = statistics.median(speeds[name])
        rows.append(
            {
                "method": name,
                "tokens": tokens[name],
                "tokens_per_second": round(med, 2),
                "rounds": [round(s, 2) for s in speeds[name]],
            }
        )
        print(
            f"| {name} | {tokens[name]} | {med:.1f} | "
            f"{', '.join(f'{s:.1f}' for s in speeds[name])} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "device": ss.backend.device_name(),
                    "prompt": PROMPT,
                    "max_tokens": args.max_tokens,
                    "rows": rows,
                    **provenance(),
                },
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
