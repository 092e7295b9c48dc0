"""How `ss+pld`'s lookup gate decides, pass by pass (issue 19): of the passes it is asked about
(every pass with a calibrated tree of lossless streams), how many had a lookup chain, and how
many verified that chain alone (the streams running, or sitting the pass out) instead of the
streams' tree with the chains grafted on; with the mean tokens a pass the gate expected of the
grafted tree. Counts only, no timing: greedy `ss+pld` over the suite's first --limit prompts.

    ./dev.sh python benchmarks/graft_count.py --model qwen2.5-coder-0.5b-instruct --adapter sql
        --suite sql --data ../shared/data/sql/dev.jsonl --limit 16 --max-tokens 64
"""

from __future__ import annotations

import collections

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported
from specstream_mlx.decoding import lookup  # noqa: E402

# isort: on
from paired import arguments, suite_prompts  # noqa: E402

INSTEAD = lookup.LookupGate.instead


def counting(counts: collections.Counter):
    """`LookupGate.instead`, counting each answer into `counts`."""

    def instead(gate, proposal, n, tree, tokens):
        size, streams = INSTEAD(gate, proposal, n, tree, tokens)
        counts["passes"] += 1
        counts["with a chain"] += bool(proposal)
        kind = "grafted" if size == 0 else "alone, streams run" if streams else "alone, streams out"
        counts[kind] += 1
        counts["expected tokens (sum)"] += tokens
        return size, streams

    return instead


def main() -> None:
    args = arguments(__doc__)
    loaded = ss.load(args.model, args.adapter)
    counts = collections.Counter()
    lookup.LookupGate.instead = counting(counts)
    try:
        for prompt in suite_prompts(loaded, args):
            ss.generate(loaded, prompt, max_tokens=args.max_tokens, decoder="ss+pld")
    finally:
        lookup.LookupGate.instead = INSTEAD
    expected = counts.pop("expected tokens (sum)") / max(counts["passes"], 1)
    print(", ".join(f"{k}: {v}" for k, v in counts.items()) + f"; expected tokens {expected:.2f}")


if __name__ == "__main__":
    main()
