"""The licence of each data source a training row can name (../shared/data/README.md and
instructions/SOURCES.md), so an adapter's config says under which terms its training text came,
beside how many rows each source gave."""

from __future__ import annotations

import re

OWN_PROMPTS = "specstream-mlx chat_prompts.INSTRUCTIONS"  # the chat mix's own instructions
OWN_LICENCE = "Apache-2.0 (specstream-mlx's own prompts)"

# the instruction prompts' `source` ("<owner/repo>@<short commit>", instructions/SOURCES.md)
INSTRUCTION_LICENCES = {
    "nayohan/dolly-15k-analysis@5797d87": "CC BY-SA 3.0 (databricks-dolly-15k)",
    "TurkuNLP/oasst-fi@45e9c46": "Apache-2.0 (OpenAssistant oasst1)",
    "Open-Assistant/oasst-model-eval@ce935de": "Apache-2.0 (OpenAssistant model-eval prompts)",
    "yizhongw/self-instruct@0b26cca": "Apache-2.0 (Self-Instruct seed tasks)",
    "openai/grade-school-math@3101c7d": "MIT (GSM8K)",
    "teknium1/GPTeacher@4810751": "MIT (GPTeacher; GPT-4-generated)",
}

# the writing tasks' and the chat mix's data sets, by folder (../shared/data/README.md)
DATASET_LICENCES = {
    "dialogsum": "CC BY-NC-SA 4.0 (DialogSum)",
    "e2e": "CC BY-SA 4.0 (E2E NLG)",
    "sql": "BSD-3-Clause (WikiSQL) and CC BY-SA 4.0 (Spider)",
    "wikitext2": "CC BY-SA 3.0 (WikiText-2)",
}


def licence_of(source: str) -> str | None:
    """The licence of a row's source, in the forms this project writes: an instruction
    repository ("<owner/repo>@<commit>"), a writing task's data file ("dialogsum train.jsonl":
    `Task.source`), a chat-mix kind's ("shared/data e2e/train.csv (...)") or this project's
    own prompts ("specstream-mlx chat_prompts.INSTRUCTIONS"); None for anything else."""
    if source in INSTRUCTION_LICENCES:
        return INSTRUCTION_LICENCES[source]
    if source == OWN_PROMPTS:
        return OWN_LICENCE
    match = re.fullmatch(r"(\S+) [^\s/]+\.(?:jsonl|csv|txt)", source)
    match = match or re.match(r"shared/data (\S+?)/", source)
    return DATASET_LICENCES.get(match.group(1)) if match else None


def licences(sources: dict[str, int]) -> dict[str, int]:
    """Rows per licence for rows per source; sources of unknown terms are counted as such."""
    out: dict[str, int] = {}
    for source, n in sources.items():
        name = licence_of(source) or "unknown: see the source's own terms"
        out[name] = out.get(name, 0) + n
    return dict(sorted(out.items()))
