"""Seconds of the first `ss` generation (4 tokens) after a shipped adapter with a draft
vocabulary is made active, and of a second one: the first makes the draft head (the head's
columns of the vocabulary's tokens, `models.arch.Arch.head_columns`) and the compiled passes.

    ./dev.sh python benchmarks/first_generation.py
"""

from __future__ import annotations

import time

import specstream_mlx as ss

RUNS = (("qwen2.5-coder-0.5b-instruct", "sql"), (None, "sql"))


def main() -> None:
    for model, adapter in RUNS:
        loaded = ss.load(model, adapter=adapter)
        for i in (1, 2):
            start = time.perf_counter()
            out = ss.generate(loaded, "How many singers are there?", max_tokens=4, decoder="ss")
            seconds = time.perf_counter() - start
            print(f"{loaded.name} {adapter}: generation {i} {seconds:.2f} s ({out.decoder})")


if __name__ == "__main__":
    main()
