"""The streams drafting from their adapter's draft vocabulary and the prompt's own tokens
("+prompt": `decoding.policy.prompt_tokens`, as `ss` runs now) against the adapter's
vocabulary alone ("own vocab": PROMPT_SLOTS patched to 0, as `ss+pld` runs now: where prompt
lookup drafts, `loop.draft_vocab` keeps the adapter's vocabulary; "ss+pld +prompt" patches that
rule out), for `ss` and `ss+pld`, paired on the same prompts in one process with plain
decoding (`ar`), interleaved prompt by prompt (issue 19).

Prints decode tokens/s per decoder (tokens after each prompt's first pass over the time after
it, summed over prompts), tau (tokens per pass), nodes per pass, the median per-prompt ratio
`ss` +prompt / own vocab, and whether every output equals `ar`'s.

    PYTHONPATH=benchmarks ./dev.sh python benchmarks/prompt_vocab.py --adapter sql --suite sql
        --data ../shared/data/sql/dev.jsonl [--model M] [--limit 10] [--max-tokens 96]
        [--rounds 1] [--json OUT]
"""

from __future__ import annotations

import json
from functools import partial

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported
from specstream_mlx.decoding import loop, policy  # noqa: E402
from specstream_mlx.decoding.tree_step import DraftVocab  # noqa: E402

# isort: on
from paired import arguments, paired, report, suite_prompts  # noqa: E402

SLOTS = policy.PROMPT_SLOTS
METHODS = {  # name -> (decoder, prompt slots)
    "ar": ("ar", SLOTS),
    "ss +prompt": ("ss", SLOTS),
    "ss own vocab": ("ss", 0),
    "ss+pld +prompt": ("ss+pld", SLOTS),
    "ss+pld own vocab": ("ss+pld", 0),
}


RULE = loop.draft_vocab


def with_prompt_anyway(dec, prompt_ids):
    """loop.draft_vocab without its rule for prompt lookup: the prompt's tokens always."""
    vocab = DraftVocab.of(dec.arch, dec.streams) if dec.streams is not None else None
    return None if vocab is None else vocab.with_prompt(dec.arch, prompt_ids)


def run(loaded, prompt: list[int], max_tokens: int, method: str):
    decoder, policy.PROMPT_SLOTS = METHODS[method]
    if method == "ss+pld +prompt":
        loop.draft_vocab = with_prompt_anyway
    try:
        return ss.generate(loaded, prompt, max_tokens=max_tokens, decoder=decoder)
    finally:
        policy.PROMPT_SLOTS, loop.draft_vocab = SLOTS, RULE


def main() -> None:
    args = arguments(__doc__)
    loaded = ss.load(args.model, args.adapter)
    prompts = suite_prompts(loaded, args)
    tree = run(loaded, prompts[0], 1, "ss +prompt").stats.tree
    print(f"ss: {json.dumps(tree)}", flush=True)
    runs = {m: partial(run, loaded, method=m) for m in METHODS}
    result = paired(runs, prompts, args.max_tokens, args.rounds, ("ss +prompt", "ss own vocab"))
    report(args, prompts, result, "ss_prompt_over_own_vocab", tree=tree, prompt_slots=SLOTS)


if __name__ == "__main__":
    main()
