"""Distillation data: the base model's own greedy answers, generated in batches (many
sequences per forward pass cost far less per token on a CPU than one at a time)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from ..prompts import encode_prompt


def distill(
    loaded,
    prompts: list[str],
    out_path: str | Path,
    max_tokens: int = 160,
    batch_size: int = 32,
    log: Callable[[str], None] = print,
) -> Path:
    """Append {"prompt", "completion"} rows to out_path; prompts already there are skipped, so
    an interrupted run resumes. Each batch is written and flushed as one block of lines."""
    from mlx_lm.generate import batch_generate

    out_path = Path(out_path)
    done = set()
    if out_path.exists():
        lines = out_path.read_text().splitlines()
        rows = [json.loads(ln) for ln in lines if _is_row(ln)]
        if len(rows) != len(lines):  # a partial last line from an interruption
            out_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        done = {r["prompt"] for r in rows}
    todo = [p for p in dict.fromkeys(prompts) if p not in done]
    log(f"distill: {len(done)} done, {len(todo)} to generate")
    eos = loaded.eos_token_ids
    for start in range(0, len(todo), batch_size):
        batch = todo[start : start + batch_size]
        ids = [encode_prompt(loaded, p) for p in batch]
        result = batch_generate(
            loaded.model, loaded.tokenizer, ids, max_tokens=max_tokens, return_token_ids=True
        )
        lines = []
        for prompt, tokens in zip(batch, result.token_ids, strict=True):
            if tokens and tokens[-1] in eos:
                tokens = tokens[:-1]
            lines.append(
                json.dumps({"prompt": prompt, "completion": loaded.tokenizer.decode(tokens)})
            )
        with open(out_path, "a", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
            f.flush()
        log(f"distill: {min(start + batch_size, len(todo))}/{len(todo)}")
    return out_path


def _is_row(line: str) -> bool:
    try:
        row = json.loads(line)
    except ValueError:
        return False
    return isinstance(row, dict) and "prompt" in row and "completion" in row
