"""Two folders of the same adapter that differ in their acceptance statistics (acceptance.json:
what the planner picks the device's tree from), `ss` and `ss+pld` with each, paired on the same
prompts in one process with plain decoding (`ar`), interleaved prompt by prompt (issue 19: the
statistics measured with the prompt's tokens in the draft vocabulary, against the shipped ones).

Prints decode tokens/s per decoder, tau, nodes per pass, the median per-prompt ratio `ss` with
--other's statistics / with --adapter's, and whether every output equals `ar`'s.

    PYTHONPATH=benchmarks ./dev.sh python benchmarks/acceptance_pair.py --other FOLDER
        --adapter sql --suite sql --data ../shared/data/sql/dev.jsonl [--model M]
        [--limit 10] [--max-tokens 96] [--rounds 1] [--json OUT]
"""

from __future__ import annotations

import json
from functools import partial

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported

# isort: on
from paired import arguments, paired, report, suite_prompts  # noqa: E402


def run(loaded, decoder: str, prompt: list[int], max_tokens: int):
    return ss.generate(loaded, prompt, max_tokens=max_tokens, decoder=decoder)


def main() -> None:
    args = arguments(__doc__, ("--other", "the adapter folder with the other statistics"))
    one, other = ss.load(args.model, args.adapter), ss.load(args.model, args.other)
    prompts = suite_prompts(one, args)
    trees = {}
    for name, loaded in (("adapter", one), ("other", other)):
        trees[name] = run(loaded, "ss", prompts[0], 1).stats.tree
        print(f"ss with {name}'s statistics: {json.dumps(trees[name])}", flush=True)
    runs = {
        "ar": partial(run, one, "ar"),
        "ss": partial(run, one, "ss"),
        "ss other": partial(run, other, "ss"),
        "ss+pld": partial(run, one, "ss+pld"),
        "ss+pld other": partial(run, other, "ss+pld"),
    }
    result = paired(runs, prompts, args.max_tokens, args.rounds, ("ss other", "ss"))
    report(args, prompts, result, "ss_other_over_ss", trees=trees, other=args.other)


if __name__ == "__main__":
    main()
