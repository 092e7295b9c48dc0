"""The instruction prompts of ../shared/data/instructions (prompt, source, category) and their
fixed dev slice.

A prompt is in the dev slice when a salted hash of its text falls under DEV_FRACTION. The
choice depends on the prompt alone, so it never changes when the file grows, shrinks or is
reordered, and no prompt ever moves between training and dev. Every category gets its share in
expectation (a stratified split in effect): on the 14,307-prompt file, 3% is 449 prompts, so
that over 300 remain for validation after the degenerate answers (about 18%) are skipped.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecstreamError
from ..jsonl import BadRow, read_rows
from ..tasks import get_task, read_task_examples

FILE = "instructions/instructions.jsonl"  # under the data folder (../shared/data)
DEV_FRACTION = 0.03
SALT = b"specstream-instructions-dev-v1\0"  # change only to draw a new slice (a new version)


@dataclass(frozen=True)
class Instruction:
    prompt: str
    source: str  # "<owner/repo>@<short commit>": attribution travels with what is trained on it
    category: str


def dev_score(prompt: str) -> float:
    """A uniform number in [0, 1) fixed by the prompt text alone."""
    digest = hashlib.sha256(SALT + prompt.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def is_dev(prompt: str) -> bool:
    """True for the prompts training never sees."""
    return dev_score(prompt) < DEV_FRACTION


def _instruction(row) -> Instruction:
    if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
        raise BadRow('needs a "prompt" string')
    return Instruction(row["prompt"], str(row.get("source", "")), str(row.get("category", "")))


def read_instructions(path: str | Path) -> list[Instruction]:
    """Every row of an instructions.jsonl file, in file order."""
    rows = read_rows(path, _instruction, "instructions")
    if not rows:
        raise SpecstreamError(f"no instructions in {path}")
    return rows


def instructions_split(path: str | Path, split: str) -> list[Instruction]:
    """The "train" or "dev" part of an instructions file, in file order."""
    if split not in ("train", "dev"):
        raise SpecstreamError(f"split must be train or dev, not {split!r}")
    want_dev = split == "dev"
    return [r for r in read_instructions(path) if is_dev(r.prompt) == want_dev]


def task_items(task: str, data_file: str | Path | None, seed: int) -> list[Instruction]:
    """The writing tool `task`'s prompts for the examples of `data_file`, shuffled by `seed`
    (`specstream distill --task` and convert/torch_distill.py draw the same order); each row's
    source names the data set and file, its category the task."""
    if not data_file:
        raise SpecstreamError("--task needs --data-file (the task's data, e.g. its train split)")
    examples = read_task_examples(task, data_file)
    random.Random(seed).shuffle(examples)
    source = get_task(task).source(data_file)
    return [Instruction(ex.prompt, source, task) for ex in examples]
