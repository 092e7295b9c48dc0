"""Prompt lookup grafted onto the streams' tree against lookup chains drafted instead of it,
paired on the same prompts in one process (issue 18): `ss+pld` as it runs now (greedy, the
streams drafting a tree: the lookup's chains grafted under the root and past the tree's deepest
path, `decoding.lookup.lookup_grafter`), `ss+pld` as it ran before (a lookup chain, when the
context has a match, verified instead of the streams' tree), `ss`, `pld` (the lookup alone)
and plain decoding (`ar`), interleaved prompt by prompt so that the machine's drift falls on
all of them alike; and `grafted-host`, grafted `ss+pld` with every pass settled on the host (as
before `decoding.loop.Grafting`, which settles a pass the lookup grafts nothing onto on the
device).

Prints decode tokens/s per decoder (tokens after each prompt's first pass over the time after
it, summed over prompts), tau (tokens per pass), nodes per pass, the median per-prompt ratio
grafted / chains, and whether every output equals `ar`'s.

    ./dev.sh python benchmarks/grafted_lookup.py --adapter sql --suite sql
        --data ../shared/data/sql/dev.jsonl [--limit 10] [--max-tokens 96] [--rounds 1]
        [--json OUT]
"""

from __future__ import annotations

import json
from functools import partial
from types import SimpleNamespace

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported
from specstream_mlx import session  # noqa: E402
from specstream_mlx.decoding import loop  # noqa: E402

# isort: on
from paired import arguments, paired, report, suite_prompts  # noqa: E402

GRAFTED = session._with_lookup


def chains_instead(loaded, dec, tree, sampling, recalled):
    """`ss+pld` before grafting: the lookup's chains drafted instead of the streams' tree
    (what `_with_lookup` gives a sampled generation)."""
    return GRAFTED(loaded, dec, tree, SimpleNamespace(greedy=False), recalled)


ON_DEVICE = loop.on_device


def host_only(dec, state, sampling) -> bool:
    """A grafting generation's passes all settled on the host."""
    return dec.graft is None and ON_DEVICE(dec, state, sampling)


METHODS = {  # name -> (decoder, how the lookup joins the streams, where passes may settle)
    "ar": ("ar", GRAFTED, ON_DEVICE),
    "ss": ("ss", GRAFTED, ON_DEVICE),
    "pld": ("pld", GRAFTED, ON_DEVICE),
    "chains": ("ss+pld", chains_instead, ON_DEVICE),
    "grafted": ("ss+pld", GRAFTED, ON_DEVICE),
    "grafted-host": ("ss+pld", GRAFTED, host_only),
}


def run(loaded, prompt: list[int], max_tokens: int, method: str):
    decoder, lookup, settles = METHODS[method]
    session._with_lookup, loop.on_device = lookup, settles
    try:
        return ss.generate(loaded, prompt, max_tokens=max_tokens, decoder=decoder)
    finally:
        session._with_lookup, loop.on_device = GRAFTED, ON_DEVICE


def main() -> None:
    args = arguments(__doc__)
    loaded = ss.load(args.model, args.adapter)
    prompts = suite_prompts(loaded, args)
    lookup = run(loaded, prompts[0], 1, "grafted").stats.tree
    print(f"grafted: {json.dumps(lookup)}", flush=True)
    runs = {m: partial(run, loaded, method=m) for m in METHODS}
    result = paired(runs, prompts, args.max_tokens, args.rounds, ("grafted", "chains"))
    report(args, prompts, result, "grafted_over_chains", grafted_tree=lookup)


if __name__ == "__main__":
    main()
