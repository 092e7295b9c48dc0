"""Benchmark suites: the prompts (and references, for the app suites) each method decodes.

- specbench, mtbench: `question.jsonl` rows {"question_id", "category", "turns": [...]}; each turn
  is a chat continuation of the previous turns and the reference decoder's answers to them.
- chat: the held-out chat mix built from ../shared/data (dev splits, unseen instructions): the
  general prompts the shipped `chat` adapter was not trained on.
- dialogsum, e2e, sql: the writing tools' tasks, in their prompt templates, with references.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecstreamError
from ..jsonl import read_rows
from ..tasks import read_task_examples
from ..training.chat_prompts import build_chat_mix

# suite -> (writing-tool task or None, the shipped adapter benchmarked by default)
SUITES = {
    "specbench": (None, "chat"),
    "mtbench": (None, "chat"),
    "chat": (None, "chat"),
    "dialogsum": ("summarize", "summarize"),
    "e2e": ("data2text", "data2text"),
    "sql": ("sql", "sql"),
}


@dataclass(frozen=True)
class Question:
    """One benchmark item: one or more user turns (later turns continue the conversation)."""

    id: str
    category: str
    turns: list[str]
    references: list[str] | None = None  # app suites: every reference answer of the item


def read_suite(suite: str, path: str | Path, limit: int | None = None) -> list[Question]:
    """The first `limit` questions of `suite` from `path` (a file; for `chat` the data folder)."""
    if suite not in SUITES:
        raise SpecstreamError(f"unknown suite {suite!r}; suites: {', '.join(SUITES)}")
    if limit is not None and limit < 1:
        raise SpecstreamError(f"limit must be >= 1, got {limit}")
    path = Path(path)
    task = SUITES[suite][0]
    if task is not None:
        examples = read_task_examples(task, path, limit)
        return [Question(str(i), task, [e.prompt], e.references) for i, e in enumerate(examples)]
    if suite == "chat":
        if not path.is_dir():
            raise SpecstreamError(f"the chat suite reads the data folder (../shared/data): {path}")
        mix = build_chat_mix(path, limit or 40, seed=1, split="dev")
        return [Question(str(i), category, [p]) for i, (category, p) in enumerate(mix)]
    return _read_questions(path)[:limit]


def _read_questions(path: Path) -> list[Question]:
    def question(row) -> Question:
        turns = row["turns"]
        if not turns or not all(isinstance(t, str) and t.strip() for t in turns):
            raise ValueError("turns must be a non-empty list of non-empty strings")
        return Question(str(row["question_id"]), str(row.get("category", "all")), turns)

    questions = read_rows(path, question, "question file")
    if not questions:
        raise SpecstreamError(f"no questions in {path}")
    return questions
