"""Training data: jsonl in the shapes mlx-lm users know, tokenized with a loss mask that covers
completions only.

- {"messages": [{"role", "content"}, ...]}: the chat template; loss on assistant turns.
- {"prompt": ..., "completion": ...}: the prompt through the chat template as a user turn, the
  completion as the assistant's answer; loss on the completion.
- {"text": ...}: raw text, loss everywhere.

Rows flagged "degenerate": true (distilled answers that loop, training/distill.py) are skipped.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import SpecstreamError
from ..jsonl import BadRow, read_rows
from .licences import licences


@dataclass
class Example:
    ids: list[int]
    loss_mask: list[bool]  # loss_mask[i]: token i is a target

    @property
    def targets(self) -> list[int]:
        """What position i is scored against: the text's own token."""
        return self.ids


@dataclass
class Dataset:
    examples: list[Example]
    source: str
    truncated: int = 0  # examples cut to max_length
    summary: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.examples)

    def hold_out(self, n: int) -> list[Example]:
        """Take the last n examples out (for validation); the summary then counts the rest."""
        held, self.examples = self.examples[-n:], self.examples[:-n]
        self.summary.update(
            examples=len(self.examples),
            tokens=sum(len(e.ids) for e in self.examples),
            target_tokens=sum(sum(e.loss_mask) for e in self.examples),
            held_out_for_validation=n,
        )
        return held


def draft_vocabulary(examples: list[Example], size: int) -> tuple[int, ...]:
    """The `size` commonest target tokens of `examples` (ties: the lower id), sorted: an
    adapter's draft vocabulary (StreamConfig.draft_vocab), what its streams learned to guess."""
    if size < 1:
        raise SpecstreamError(f"a draft vocabulary needs at least one token, got size {size}")
    counts = Counter(t for ex in examples for t, m in zip(ex.ids, ex.loss_mask, strict=True) if m)
    if not counts:
        raise SpecstreamError("no target tokens to take a draft vocabulary from")
    common = sorted(counts, key=lambda t: (-counts[t], t))[:size]
    return tuple(sorted(common))


def read_jsonl(path: str | Path) -> list[dict]:
    """Rows of a jsonl file; every malformed line is reported with its number, at once."""
    rows = read_rows(path, _training_row)
    if not rows:
        raise SpecstreamError(f"no examples in {path}")
    return rows


def _training_row(row) -> dict:
    if not isinstance(row, dict) or not (
        {"messages", "text"} & row.keys() or {"prompt", "completion"} <= row.keys()
    ):
        raise BadRow("needs messages, prompt+completion, or text")
    if "text" in row:
        _check_text(row, "text")
    elif "messages" in row:
        _check_messages(row["messages"])
    else:
        _check_text(row, "prompt")
        _check_text(row, "completion")
    return row


def _check_text(row: dict, key: str) -> None:
    if not isinstance(row[key], str):
        raise BadRow(f'"{key}" must be a string, not {type(row[key]).__name__}')


def _check_messages(messages) -> None:
    roles = ("system", "user", "assistant")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise BadRow('"messages" must be a list of {"role", "content"} objects')
    for m in messages:
        if m.get("role") not in roles or not isinstance(m.get("content"), str):
            raise BadRow(f"every message needs a role ({', '.join(roles)}) and a string content")
    if not any(m["role"] == "assistant" for m in messages):
        raise BadRow("no assistant message: nothing to learn from")


def _chat_ids(tokenizer, messages: list[dict], add_generation_prompt: bool) -> list[int]:
    return list(
        tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=True
        )
    )


def encode_row(tokenizer, row: dict) -> Example:
    if "text" in row:
        ids = list(tokenizer.encode(row["text"]))
        return Example(ids, [False] + [True] * (len(ids) - 1))
    if "messages" in row:
        messages = row["messages"]
    else:
        messages = [
            {"role": "user", "content": row["prompt"]},
            {"role": "assistant", "content": row["completion"]},
        ]
    ids, mask = [], []
    for i, message in enumerate(messages):
        if message.get("role") == "assistant":
            before = _chat_ids(tokenizer, messages[:i], add_generation_prompt=True)
            after = _chat_ids(tokenizer, messages[: i + 1], add_generation_prompt=False)
            if after[: len(before)] != before:  # template does not extend by prefix
                raise SpecstreamError("the chat template does not render turns as prefixes")
            mask += [False] * (len(before) - len(ids)) + [True] * (len(after) - len(before))
            ids = after
    final = _chat_ids(tokenizer, messages, add_generation_prompt=False)
    mask += [False] * (len(final) - len(ids))
    return Example(final, mask)


def load_dataset(
    path: str | Path, tokenizer, max_length: int = 512, task: str | None = None
) -> Dataset:
    """Tokenize a jsonl file, or with `task` (summarize | data2text | sql) a data file in the
    shape of ../shared/data rendered with that writing tool's prompt template. Examples longer
    than max_length are cut (and counted); rows flagged degenerate are skipped (and counted)."""
    degenerate = 0
    if task:
        from ..tasks import get_task, read_task_examples

        source = get_task(task).source(path)
        rows = [{**ex.row(), "source": source} for ex in read_task_examples(task, path)]
    else:
        rows = read_jsonl(path)
        kept = [r for r in rows if r.get("degenerate") is not True]
        degenerate, rows = len(rows) - len(kept), kept
    # attribution travels with what is trained on the data (adapter_config.json's training.data)
    sources = Counter(r["source"] for r in rows if isinstance(r.get("source"), str))
    examples, truncated = [], 0
    for row in rows:
        ex = encode_row(tokenizer, row)
        if len(ex.ids) > max_length:
            truncated += 1
            ex = Example(ex.ids[:max_length], ex.loss_mask[:max_length])
        if any(ex.loss_mask[1:]):
            examples.append(ex)
    if not examples:
        raise SpecstreamError(f"no example in {path} has a completion token to learn from")
    targets = sum(sum(e.loss_mask) for e in examples)
    summary = {
        "path": str(path),
        "task": task,
        "examples": len(examples),
        "tokens": sum(len(e.ids) for e in examples),
        "target_tokens": targets,
        "truncated": truncated,
        "skipped_degenerate": degenerate,
        "max_length": max_length,
    }
    if sources:
        summary["sources"] = dict(sorted(sources.items()))
        summary["licences"] = licences(sources)
    return Dataset(examples, str(path), truncated, summary)
