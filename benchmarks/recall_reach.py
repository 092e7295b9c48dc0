"""How many tokens a pass the lookup would decide with and without the memory of earlier
answers (`decoding.lookup.LookupMemory`), counted without timing (issues 18 and 19): plain
greedy answers to the suite's first --limit prompts, then, pass by pass over each answer, the
lookup's whole chain (no gate) accepted as far as it matches the answer. Three memories: none
(the context alone, as `pld` drafted before), the answers to every earlier prompt of the suite
(as `pld` drafts now, in the suite's order), and, for the sql suite, only the earlier answers
about other tables (the sql dev set asks several questions about each table in a row, so the
second measures a user asking about one table again, the third one asking about a new one).

    ./dev.sh python benchmarks/recall_reach.py --model qwen2.5-coder-0.5b-instruct
        --adapter sql --suite sql --data ../shared/data/sql/dev.jsonl --limit 48
        --max-tokens 96 [--json OUT]
"""

from __future__ import annotations

import re

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported
from specstream_mlx.decoding.lookup import LookupConfig, LookupMemory, lookup_match  # noqa: E402
from specstream_mlx.provenance import provenance  # noqa: E402

# isort: on
from paired import arguments, suite_prompts, write  # noqa: E402


def tau(prompt: list[int], answer: list[int], config: LookupConfig, recalled) -> tuple[int, int]:
    """Passes and drafted nodes the lookup needs for `answer`: each pass decides the drafts
    that match it and one token more."""
    done = passes = nodes = 0
    while done < len(answer):
        draft = lookup_match(prompt + answer[:done], config, recalled)[0]
        right = agreed(draft, answer[done:])
        done, passes, nodes = min(done + right + 1, len(answer)), passes + 1, nodes + len(draft)
    return passes, nodes


def agreed(draft: list[int], rest: list[int]) -> int:
    """How many of `draft` match the start of `rest`."""
    count = 0
    for drafted, token in zip(draft, rest, strict=False):
        if drafted != token:
            break
        count += 1
    return count


def table(loaded, prompt: list[int]) -> str | None:
    found = re.search(r"CREATE TABLE (\S+)", loaded.tokenizer.decode(prompt))
    return found.group(1) if found else None


def main() -> None:
    args = arguments(__doc__)
    loaded = ss.load(args.model, args.adapter)
    prompts = suite_prompts(loaded, args)
    answers = [ss.generate(loaded, p, max_tokens=args.max_tokens).token_ids for p in prompts]
    tables = [table(loaded, p) for p in prompts]
    config = LookupConfig()
    memories = {"context only": lambda i: None, "earlier answers": lambda i: range(i)}
    if all(tables):
        memories["earlier answers, other tables"] = lambda i: [
            j for j in range(i) if tables[j] != tables[i]
        ]
    rows = {}
    for name, earlier in memories.items():
        tokens = passes = nodes = 0
        for i, (prompt, answer) in enumerate(zip(prompts, answers, strict=True)):
            kept = earlier(i)
            recalled = None
            if kept is not None:
                memory = LookupMemory()
                for j in kept:
                    memory.add(prompts[j], answers[j])
                recalled = memory.recall(prompt)
            p, n = tau(prompt, answer, config, recalled)
            tokens, passes, nodes = tokens + len(answer), passes + p, nodes + n
        rows[name] = {"tau": round(tokens / passes, 3), "drafts_per_pass": round(nodes / passes, 2)}
        print(f"{name}: tau {rows[name]['tau']}, {rows[name]['drafts_per_pass']} drafts a pass")
    write(args, prompts, {"lookup": vars(config), "memories": rows}, provenance())


if __name__ == "__main__":
    main()
