"""`ss+pld` verifying the lookup's chain alone where the gate expects it to decide more tokens
per ms than the streams' tree with it grafted on, lossless streams sitting that pass out where
that pays too (`decoding.lookup.LookupGate.instead`, as `ss+pld` runs now: "choosing"), against
`ss+pld` always keeping the streams' tree (the chain only grafted, as before:
"always-grafted"), paired on the same prompts in one process with `pld` (the lookup alone),
`ss` and plain decoding (`ar`), interleaved prompt by prompt (issues 18 and 19).

Prints decode tokens/s per decoder (tokens after each prompt's first pass over the time after
it, summed over prompts), tau (tokens per pass), nodes per pass, the median per-prompt ratio
choosing / always-grafted, and whether every output equals `ar`'s.

    ./dev.sh python benchmarks/chain_alone.py --adapter sql --suite sql
        --data ../shared/data/sql/dev.jsonl [--model M] [--limit 10] [--max-tokens 96]
        [--rounds 1] [--json OUT]
"""

from __future__ import annotations

import json
from functools import partial

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported
from specstream_mlx.decoding import lookup  # noqa: E402

# isort: on
from paired import arguments, paired, report, suite_prompts  # noqa: E402

INSTEAD = lookup.LookupGate.instead
METHODS = {  # name -> (decoder, whether a pass may verify the chain alone)
    "ar": ("ar", True),
    "ss": ("ss", True),
    "pld": ("pld", True),
    "choosing": ("ss+pld", True),
    "always-grafted": ("ss+pld", False),
}


def run(loaded, prompt: list[int], max_tokens: int, method: str):
    decoder, alone = METHODS[method]
    if not alone:
        lookup.LookupGate.instead = lambda *_: (0, True)
    try:
        return ss.generate(loaded, prompt, max_tokens=max_tokens, decoder=decoder)
    finally:
        lookup.LookupGate.instead = INSTEAD


def main() -> None:
    args = arguments(__doc__)
    loaded = ss.load(args.model, args.adapter)
    prompts = suite_prompts(loaded, args)
    tree = run(loaded, prompts[0], 1, "choosing").stats.tree
    print(f"ss+pld: {json.dumps(tree)}", flush=True)
    runs = {m: partial(run, loaded, method=m) for m in METHODS}
    result = paired(runs, prompts, args.max_tokens, args.rounds, ("choosing", "always-grafted"))
    report(args, prompts, result, "choosing_over_always_grafted", tree=tree)


if __name__ == "__main__":
    main()
