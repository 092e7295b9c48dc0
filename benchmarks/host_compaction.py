"""The host-settled passes' cache compaction, in place against copying (issue 18): `ss+pld`
(prompt lookup grafted onto the streams' tree, settled on the host) with the compaction as it
runs now (decoding.kv.compact: the rows to move read first, then written in place) and as it
ran before (read and written in one graph, so MLX copied every layer's buffer), `pld` (chains:
their accepted path never moves) and plain decoding (`ar`), paired on the same prompts in one
process, interleaved prompt by prompt.

Prints decode tokens/s per decoder, tau, nodes per pass, the median per-prompt ratio
now / before, and whether every output equals `ar`'s.

    ./dev.sh python benchmarks/host_compaction.py --adapter chat --suite chat
        --data ../shared/data [--limit 10] [--max-tokens 96] [--rounds 1] [--json OUT]
"""

from __future__ import annotations

from functools import partial

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported
import mlx.core as mx  # noqa: E402
from specstream_mlx.decoding import loop  # noqa: E402

# isort: on
from paired import arguments, paired, report, suite_prompts  # noqa: E402

IN_PLACE = loop.compact


def copying(caches: list, start: int, keeps: list[list[int]]) -> None:
    """The compaction before: each layer's rows moved in one read-and-write graph."""
    for cache, keep in zip(caches, keeps, strict=True):
        n = len(keep)
        cache.offset = start + n
        if keep == list(range(n)):
            continue
        idx = mx.array(keep) + start
        for name in ("keys", "values"):
            x = getattr(cache, name)
            x[..., start : start + n, :] = x[..., idx, :]


METHODS = {"ar": ("ar", IN_PLACE), "pld": ("pld", IN_PLACE)}
METHODS |= {"ss+pld before": ("ss+pld", copying), "ss+pld": ("ss+pld", IN_PLACE)}


def run(loaded, prompt: list[int], max_tokens: int, method: str):
    decoder, compact = METHODS[method]
    loop.compact = compact
    try:
        return ss.generate(loaded, prompt, max_tokens=max_tokens, decoder=decoder)
    finally:
        loop.compact = IN_PLACE


def main() -> None:
    args = arguments(__doc__)
    loaded = ss.load(args.model, args.adapter)
    prompts = suite_prompts(loaded, args)
    runs = {m: partial(run, loaded, method=m) for m in METHODS}
    result = paired(runs, prompts, args.max_tokens, args.rounds, ("ss+pld", "ss+pld before"))
    report(args, prompts, result, "now_over_before")


if __name__ == "__main__":
    main()
