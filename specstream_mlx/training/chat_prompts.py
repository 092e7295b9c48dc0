"""Varied chat prompts built from the real data sets in ../shared/data, for distilling the
general-purpose `chat` adapter (the base model's own answers are the training targets)."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

from ..errors import SpecstreamError
from .instructions import Instruction
from .licences import OWN_PROMPTS

INSTRUCTIONS = [
    "Explain why the sky is blue.",
    "Give me three tips for better sleep.",
    "What is the difference between a virus and a bacterium?",
    "Write a short poem about rain.",
    "How do I make a cup of tea?",
    "Describe the water cycle in simple terms.",
    "What are the benefits of regular exercise?",
    "Write a short story about a lost cat.",
    "Explain what a computer program is to a child.",
    "List five fruits and their colours.",
    "What causes the seasons on Earth?",
    "Give me a recipe for pancakes.",
    "How does a bicycle work?",
    "Write a polite email declining a meeting invitation.",
    "What is photosynthesis?",
    "Suggest a name for a new coffee shop and explain it.",
    "Why do we need to drink water?",
    "Explain the rules of chess briefly.",
    "What is the capital of Japan and what is it known for?",
    "Describe a sunset at the beach.",
    "How can I learn a new language faster?",
    "What is the role of the heart in the body?",
    "Write a thank-you note to a teacher.",
    "Explain what gravity is.",
    "Give me a packing list for a weekend camping trip.",
    "What are volcanoes and how do they form?",
    "Write a short dialogue between a customer and a waiter.",
    "How do plants grow from seeds?",
    "What is a healthy breakfast?",
    "Explain how the internet works in a few sentences.",
]
EVAL_INSTRUCTIONS = [
    "Explain how rainbows form.",
    "Give me three ideas for a birthday party.",
    "What is the difference between weather and climate?",
    "Write a haiku about the moon.",
    "How do I plant a tree?",
    "Why is recycling important?",
    "Describe a busy city street in the morning.",
    "What does a librarian do?",
]


def _wikitext_passages(path: Path, n: int, rng: random.Random) -> list[str]:
    lines = [
        ln.strip()
        for ln in path.read_text().splitlines()
        if len(ln.strip()) > 200 and not ln.strip().startswith("=")
    ]
    return [ln[:600] for ln in rng.sample(lines, min(n, len(lines)))]


def build_chat_prompts(
    data_dir: str | Path, n: int, seed: int = 0, split: str = "train"
) -> list[str]:
    """n prompts mixing written instructions and tasks over wikitext, DialogSum, E2E and SQL,
    shuffled with `seed`. split "train" (for training) or "dev" (held out: the dev/valid files
    and a separate list of instructions)."""
    return [prompt for _, prompt in build_chat_mix(data_dir, n, seed, split)]


def build_chat_mix(
    data_dir: str | Path, n: int, seed: int = 0, split: str = "train"
) -> list[tuple[str, str]]:
    """`build_chat_prompts` with each prompt's category: instruction, passage, dialogue,
    data2text or sql."""
    data = Path(data_dir)
    wiki_file = "wikitext2/train.txt" if split == "train" else "wikitext2/valid.txt"
    other = "train" if split == "train" else "dev"
    instructions = INSTRUCTIONS if split == "train" else EVAL_INSTRUCTIONS
    needed = [wiki_file, f"dialogsum/{other}.jsonl", f"e2e/{other}.csv", f"sql/{other}.jsonl"]
    missing = [p for p in needed if not (data / p).is_file()]
    if missing:
        raise SpecstreamError(f"data missing under {data}: {', '.join(missing)}")
    rng = random.Random(seed)
    share = max(n // 5, 1)
    prompts = [("instruction", rng.choice(instructions)) for _ in range(share)]
    wiki = [
        "Summarize this passage in two sentences:\n\n{}",
        "What is this passage about?\n\n{}",
        "Explain the main point of this text in simple words:\n\n{}",
    ]
    prompts += [
        ("passage", rng.choice(wiki).format(p))
        for p in _wikitext_passages(data / wiki_file, share, rng)
    ]
    dialogues = [json.loads(line) for line in (data / f"dialogsum/{other}.jsonl").open()]
    prompts += [
        ("dialogue", "Summarize the following dialogue.\n\n" + d["dialogue"][:1200])
        for d in rng.sample(dialogues, share)
    ]
    with open(data / f"e2e/{other}.csv", newline="") as f:
        mrs = sorted({row["mr"] for row in csv.DictReader(f)})
    prompts += [
        ("data2text", "Write a sentence about a restaurant with these attributes: " + mr)
        for mr in rng.sample(mrs, share)
    ]
    sql = [json.loads(line) for line in (data / f"sql/{other}.jsonl").open()]
    prompts += [
        (
            "sql",
            f"Write an SQL query for this question.\nTable: {q['context']}\n"
            f"Question: {q['question']}",
        )
        for q in rng.sample(sql, n - len(prompts))
    ]
    rng.shuffle(prompts)
    return prompts


# where a chat-mix prompt's text comes from (../shared/data/README.md: licences), per kind
MIX_SOURCES = {
    "instruction": OWN_PROMPTS,
    "passage": "shared/data wikitext2/train.txt (WikiText-2, CC BY-SA 3.0)",
    "dialogue": "shared/data dialogsum/train.jsonl (DialogSum, CC BY-NC-SA 4.0)",
    "data2text": "shared/data e2e/train.csv (E2E NLG, CC BY-SA 4.0)",
    "sql": "shared/data sql/train.jsonl (WikiSQL subset, BSD-3; Spider, CC BY-SA 4.0)",
}

# the kinds distilled by default: those whose licence allows commercial use (an adapter
# trained on DialogSum's answers is for non-commercial use)
PERMISSIVE_KINDS = ("instruction", "passage", "data2text", "sql")


def chat_mix_items(
    data: str | Path, n: int, seed: int, kinds: tuple[str, ...] = PERMISSIVE_KINDS
) -> list[Instruction]:
    """The prompts of `kinds` among n of the chat suite's mix over the train splits, as
    distillation items naming their data set and licence."""
    mix = build_chat_mix(data, n, seed=seed, split="train")
    return [
        Instruction(prompt, MIX_SOURCES[category], category)
        for category, prompt in mix
        if category in kinds
    ]


def mix_kinds(text: str | None) -> tuple[str, ...]:
    """`--mix-kinds`: "all" or a comma list of the chat mix's kinds (None: the permissive ones)."""
    if text is None:
        return PERMISSIVE_KINDS
    if text == "all":
        return tuple(MIX_SOURCES)
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in MIX_SOURCES]
    if unknown or not kinds:
        raise SpecstreamError(
            f"--mix-kinds: unknown kind {', '.join(unknown) or '(none given)'}; "
            f"use all or some of {', '.join(MIX_SOURCES)}"
        )
    return kinds
