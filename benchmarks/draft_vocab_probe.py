"""What an adapter's draft vocabulary leaves out, and what a larger one buys (issue 19).

The streams of an adapter with a draft vocabulary (StreamConfig.draft_vocab) can only draft its
tokens. This decodes the suite's prompts plainly and sorts the tokens it wrote: in the draft
vocabulary, outside it but in the prompt (a per-request vocabulary would add them), outside both.
Then it decodes them with `ss` (greedy, tree "auto") once per vocabulary and prints tau
(tokens per pass) and the tree the planner chose:
  shipped  the adapter's own;
  prompts  the adapter's plus every token of this run's prompts (what a per-request vocabulary
           would add, slightly more: each prompt also gets the others' tokens);
  rows     the adapter's plus every token of --rows' text fields (a larger static one).
The variants are written as adapter folders under --out (only their config differs).

    PYTHONPATH=benchmarks ./dev.sh python benchmarks/draft_vocab_probe.py --adapter sql
        --suite sql --data ../shared/data/sql/dev.jsonl --model qwen2.5-coder-0.5b-instruct
        --limit 16 --max-tokens 64 --rows ../shared/data/sql/train.jsonl --out runs/vocab
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported
from specstream_mlx.streams.adapter_io import CONFIG, resolve_adapter  # noqa: E402

# isort: on
from paired import arguments, suite_prompts  # noqa: E402


def where(loaded, prompts: list, max_tokens: int, vocab: set) -> dict:
    """Shares of plain decoding's tokens in `vocab`, only in the prompt, or in neither."""
    counts = {"draft_vocab": 0, "prompt_only": 0, "neither": 0}
    for prompt in prompts:
        plain = ss.generate(loaded, prompt, max_tokens=max_tokens, decoder="ar").token_ids
        for token in plain:
            kind = "prompt_only" if token in prompt else "neither"
            counts["draft_vocab" if token in vocab else kind] += 1
    total = sum(counts.values())
    return {"tokens": total, **{k: round(v / total, 3) for k, v in counts.items()}}


def row_tokens(loaded, path: str) -> set[int]:
    """Every token of the rows' text fields, as they start a text, a word or a line."""
    tokens = set()
    for line in Path(path).read_text().splitlines():
        for text in json.loads(line).values():
            if isinstance(text, str):
                for start in ("", " ", "\n"):
                    tokens.update(loaded.tokenizer.encode(start + text, add_special_tokens=False))
    return tokens


def variant(source: Path, out: Path, vocab: list[int]) -> Path:
    """A copy of adapter folder `source` drafting from `vocab`."""
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(source, out)
    config = json.loads((out / CONFIG).read_text())
    config["stream_config"]["draft_vocab"] = vocab
    (out / CONFIG).write_text(json.dumps(config))
    return out


def tau(loaded, prompts: list, max_tokens: int) -> dict:
    tokens = passes = 0
    for prompt in prompts:
        result = ss.generate(loaded, prompt, max_tokens=max_tokens, decoder="ss")
        tokens += result.stats.generated_tokens
        passes += result.stats.forward_passes
    tree = result.stats.tree or {}
    return {"tau": round(tokens / passes, 3), "passes": passes, "tree": tree.get("paths")}


def main() -> None:
    args = arguments(
        __doc__,
        ("--rows", "a JSON Lines file whose text fields make the larger static vocabulary"),
        ("--out", "the folder the variant adapters are written to"),
    )
    loaded = ss.load(args.model, adapter=args.adapter)
    source = resolve_adapter(args.adapter, loaded)
    shipped = sorted(loaded.streams.config.draft_vocab or ())
    if not shipped:
        raise SystemExit(f"{args.adapter} drafts from the whole vocabulary")
    prompts = suite_prompts(loaded, args)
    report = {"plain_tokens": where(loaded, prompts, args.max_tokens, set(shipped))}
    print(json.dumps(report), flush=True)
    vocabs = {
        "shipped": shipped,
        "prompts": sorted(set(shipped).union(*prompts)),
        "rows": sorted(set(shipped) | row_tokens(loaded, args.rows)),
    }
    for name, vocab in vocabs.items():
        folder = source if name == "shipped" else variant(source, Path(args.out) / name, vocab)
        ss.use_adapter(loaded, str(folder))
        report[name] = {"vocab": len(vocab), **tau(loaded, prompts, args.max_tokens)}
        print(json.dumps({name: report[name]}), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
