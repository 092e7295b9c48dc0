"""Speculative Streaming on the default model before training: the overhead of untrained streams
(tau about 1) and the ceiling with an oracle draft (the true continuation fed as the streams'
proposal), against plain decoding, in one interleaved run.

    ./dev.sh python benchmarks/speculative_overhead.py [--max-tokens 64] [--rounds 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported
from specstream_mlx.generate import default_streams, encode_prompt  # noqa: E402
from specstream_mlx.provenance import provenance  # noqa: E402
from specstream_mlx.streams.config import StreamConfig  # noqa: E402
from specstream_mlx.streams.params import StreamParams  # noqa: E402
# isort: on

PROMPT = "Write a long, detailed story about a lighthouse keeper who finds a message in a bottle."


def oracle(truth: list[int], n_prompt: int, gamma: int, top_k: int, vocab: int):
    """Each stream proposes the true token plus top_k - 1 fixed distractors (a k-ary tree)."""
    rng = random.Random(0)
    distractors = [rng.randrange(vocab) for _ in range(64)]

    def draft(history: list[int]) -> list[list[int]]:
        done = len(history) - n_prompt  # history[-1] is the next root
        out = []
        for j in range(gamma):
            true = truth[done + j] if done + j < len(truth) else 0
            out.append([true] + distractors[j * top_k : j * top_k + top_k - 1])
        return out

    return draft


def run(loaded, prompt, max_tokens, decoder="ar", streams=None, draft=None) -> dict:
    start = time.perf_counter()
    chunks = list(
        ss.stream_generate(
            loaded,
            prompt,
            max_tokens=max_tokens,
            decoder=decoder,
            streams=streams,
            draft_override=draft,
        )
    )
    wall = time.perf_counter() - start
    stats = chunks[-1].stats
    return {
        "tokens": [t for c in chunks for t in c.token_ids],
        "wall": wall,
        "tps": stats.tokens_per_second,
        "tau": stats.mean_accepted_tokens,
        "passes": stats.forward_passes,
        "nodes": stats.tree_nodes / stats.forward_passes,
        "kept": stats.tree_nodes_kept / stats.forward_passes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    loaded = ss.load()
    prompt = encode_prompt(loaded, PROMPT)
    loaded.eos_token_ids.clear()  # fixed-length runs: every method decodes max_tokens tokens
    truth = run(loaded, prompt, args.max_tokens)["tokens"]
    vocab, layers, d = (
        loaded.config[k] for k in ("vocab_size", "num_hidden_layers", "hidden_size")
    )

    def streams(**cfg):
        return StreamParams(StreamConfig(**cfg).validate(layers), d)

    methods = {"ar": lambda: run(loaded, prompt, args.max_tokens)}
    untrained = {
        "ss untrained, paper tree (gamma 4, k 3, cap 32)": default_streams(loaded),
        "ss untrained, chain (gamma 4, k 1)": streams(top_k=1),
    }
    for name, params in untrained.items():
        methods[name] = lambda p=params: run(loaded, prompt, args.max_tokens, "ss", p)
    for gamma, top_k in ((1, 1), (2, 1), (4, 1), (4, 2), (4, 3)):
        params = streams(gamma=gamma, top_k=top_k)
        draft = oracle(truth, len(prompt), gamma, top_k, vocab)
        methods[f"ss oracle, gamma {gamma}, k {top_k}, cap 32"] = lambda p=params, dr=draft: run(
            loaded, prompt, args.max_tokens, "ss", p, dr
        )

    results = {name: [] for name in methods}
    for _ in range(args.rounds):
        for name, fn in methods.items():
            r = fn()
            assert r["tokens"] == truth, f"{name}: output differs from plain greedy decoding"
            results[name].append(r)
    ar_wall = statistics.median(r["wall"] for r in results["ar"])
    print(
        f"default model, float32, {ss.backend.device_name()}, prompt {len(prompt)} tokens, "
        f"{args.max_tokens} new tokens, {args.rounds} interleaved rounds; all outputs equal ar"
    )
    print("| method | tau | nodes/pass (kept) | ms/pass | tokens/s | speedup vs ar |")
    print("|---|---:|---:|---:|---:|---:|")
    rows = []
    for name, rs in results.items():
        wall = statistics.median(r["wall"] for r in rs)
        r = rs[0]
        row = {
            "method": name,
            "tau": round(r["tau"], 3),
            "nodes": round(r["nodes"], 1),
            "kept": round(r["kept"], 1),
            "ms_per_pass": round(wall / r["passes"] * 1000, 1),
            "tokens_per_second": round(args.max_tokens / wall, 2),
            "speedup": round(ar_wall / wall, 3),
        }
        rows.append(row)
        print(
            f"| {name} | {row['tau']} | {row['nodes']} ({row['kept']}) | "
            f"{row['ms_per_pass']} | {row['tokens_per_second']} | {row['speedup']} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "max_tokens": args.max_tokens,
                    "rounds": args.rounds,
                    "rows": rows,
                    **provenance(),
                },
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
