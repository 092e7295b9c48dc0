"""The writing tools' tasks: their prompt templates and readers for the real data sets in the
shapes of ../shared/data. Training, benchmarks and the `write` tools all build prompts here, so an
adapter always sees at run time exactly the prompt it was trained on.

- summarize: DialogSum rows {"dialogue", "summary"} (test files may carry "summaries", a list)
- data2text: E2E CSV with columns mr, ref (several rows per MR: the references of that MR)
- sql: sql-create-context rows {"question", "context", "answer"}
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from .errors import SpecstreamError
from .jsonl import data_file, read_rows


@dataclass(frozen=True)
class Task:
    name: str  # the writing tool: summarize | data2text | sql
    dataset: str  # the data set its training rows come from
    template: str  # str.format template over the row's input fields
    fields: tuple[str, ...]  # input fields the template needs

    def prompt(self, **inputs: str) -> str:
        missing = [f for f in self.fields if not str(inputs.get(f, "")).strip()]
        if missing:
            raise SpecstreamError(f"{self.name}: missing input {', '.join(missing)}")
        return self.template.format(**{f: str(inputs[f]).strip() for f in self.fields})

    def source(self, data_file: str | Path) -> str:
        """What a training row from `data_file` names as its source: data set and file."""
        return f"{self.dataset} {Path(data_file).name}"


TASKS = {
    "summarize": Task(
        "summarize",
        "dialogsum",
        "Summarize the following dialogue in one or two sentences.\n\n{dialogue}",
        ("dialogue",),
    ),
    "data2text": Task(
        "data2text",
        "e2e",
        "Write a short restaurant description that states every attribute below.\n\n{mr}",
        ("mr",),
    ),
    "sql": Task(
        "sql",
        "sql",
        "Write the SQL query that answers the question for this table. Answer with the query "
        "only.\n\n{context}\n\nQuestion: {question}",
        ("context", "question"),
    ),
}


@dataclass
class TaskExample:
    prompt: str
    references: list[str]  # every reference answer (the first is the training target)

    def row(self) -> dict:
        """The {"prompt", "completion"} training row."""
        return {"prompt": self.prompt, "completion": self.references[0]}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise SpecstreamError(f"unknown task {name!r}; tasks: {', '.join(TASKS)}")
    return TASKS[name]


def read_task_examples(name: str, path: str | Path, limit: int | None = None) -> list[TaskExample]:
    """Examples of task `name` from a data file in its data set's shape. E2E rows are grouped by
    MR (one example, all its references); DialogSum's optional "summaries" add references."""
    task, path = get_task(name), data_file(path)
    if task.dataset == "e2e":
        examples = _read_e2e(task, path)
    else:
        examples = _read_jsonl(task, path)
    if not examples:
        raise SpecstreamError(f"no {name} examples in {path}")
    return examples[:limit] if limit else examples


def _read_jsonl(task: Task, path: Path) -> list[TaskExample]:
    answer_key = {"dialogsum": "summary", "sql": "answer"}[task.dataset]

    def example(row) -> TaskExample:
        refs = [row[answer_key]] if answer_key in row else []
        refs += [r for r in row.get("summaries", []) if r not in refs]
        if not refs:
            raise KeyError(answer_key)
        return TaskExample(task.prompt(**row), [r.strip() for r in refs])

    return read_rows(path, example, f"{task.dataset} data")


def _read_e2e(task: Task, path: Path) -> list[TaskExample]:
    refs: dict[str, list[str]] = {}
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames or not {"mr", "ref"} <= set(reader.fieldnames):
            raise SpecstreamError(f"{path}: an E2E CSV needs the columns mr,ref")
        for row in reader:
            if row["mr"] and row["ref"]:
                refs.setdefault(row["mr"].strip(), []).append(row["ref"].strip())
    return [TaskExample(task.prompt(mr=mr), r) for mr, r in refs.items()]
