"""The lookup with and without the memory of earlier answers (`decoding.lookup.LookupMemory`),
paired on the same prompts in one process (issues 18 and 19): `pld` and `ss+pld` as they run
now (where the context has no match of 2 tokens or more, drafting what followed its last
n-gram in the answers of the suite's earlier prompts), the same two with an empty memory
("-nomem"), and plain decoding (`ar`), interleaved prompt by prompt. Prompts run in the suite's
order, one round: a prompt's own answer is never recalled (LookupMemory.recall), and every
method recalls the same answers (they all decode the same text).

Prints decode tokens/s per decoder (tokens after each prompt's first pass over the time after
it, summed over prompts), tau (tokens per pass), nodes per pass, the median per-prompt ratio
ss+pld / ss+pld-nomem, and whether every output equals `ar`'s.

    ./dev.sh python benchmarks/lookup_memory.py --adapter sql --suite sql
        --data ../shared/data/sql/dev.jsonl [--model M] [--limit 10] [--max-tokens 96]
        [--json OUT]
"""

from __future__ import annotations

from functools import partial

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported

# isort: on
from paired import arguments, paired, report, suite_prompts  # noqa: E402

METHODS = {
    "ar": "ar",
    "pld-nomem": "pld",
    "pld": "pld",
    "ss+pld-nomem": "ss+pld",
    "ss+pld": "ss+pld",
}


def run(loaded, prompt: list[int], max_tokens: int, method: str):
    kept = loaded.lookup_memory
    if method.endswith("-nomem"):
        loaded.lookup_memory = {}  # an empty memory, thrown away after this generation
    try:
        return ss.generate(loaded, prompt, max_tokens=max_tokens, decoder=METHODS[method])
    finally:
        loaded.lookup_memory = kept


def main() -> None:
    args = arguments(__doc__)
    loaded = ss.load(args.model, args.adapter)
    prompts = suite_prompts(loaded, args)
    runs = {m: partial(run, loaded, method=m) for m in METHODS}
    result = paired(runs, prompts, args.max_tokens, args.rounds, ("ss+pld", "ss+pld-nomem"))
    report(args, prompts, result, "memory_over_nomem")


if __name__ == "__main__":
    main()
