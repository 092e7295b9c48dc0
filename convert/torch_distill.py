"""Distillation on a GPU with the PyTorch path: the base model's own greedy answers to the
instruction prompts, in the rows `specstream distill` writes (training/distill.py: prompt,
completion, source, category, tokens, capped, loop, loop_tail, degenerate) and resumable the same
way (prompts already in the output are skipped; a partial last line is cut off). For a lent GPU
machine, where MLX is not installed (scripts/cuda_train.sh `distill`).

Batches of prompts of similar length decode together with transformers' `generate` (greedy, left
padding). The answers are plain greedy decoding's in float32, as MLX's are, but not guaranteed
token for token the same: a different kernel or batch shape rounds differently, and where the
two best tokens' logits nearly tie the argmax may differ (docs/CORPUS.md records which shards
came from here).

    python -m convert.torch_distill --instructions ../shared/data/instructions/instructions.jsonl \
        --out runs/distill/instructions_train.jsonl [--split train] [--limit N] [--max-new N] \
        [--model GGUF] [--max-tokens 160] [--batch-size 128] [--device cuda]

`--chat-mix N` answers instead N prompts of the chat suite's mix built from the train splits
(training/chat_prompts.py: written instructions, WikiText passages, DialogSum dialogues, E2E
meaning representations, SQL questions; `--seed`, `--data`): four fifths of the chat suite's
prompts are of those kinds, which the instruction answers do not cover. Repeated prompts are
answered once. `--mix-kinds` keeps some kinds only; by default every kind but the DialogSum
dialogues, whose licence (CC BY-NC-SA 4.0) would make the `chat` adapter non-commercial
(`--mix-kinds all` keeps them).

`--task TASK --data-file FILE` answers a writing tool's prompts for FILE's examples in the
order `specstream distill --task` draws (`--seed`): a lossless adapter's streams learning what
the model itself writes for that tool (Qwen's `sql`, scripts/cuda_train.sh `own`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from specstream_mlx.errors import SpecstreamError
from specstream_mlx.tasks import TASKS
from specstream_mlx.training.chat_prompts import chat_mix_items, mix_kinds
from specstream_mlx.training.distill import DistillStats, make_row, still_to_answer
from specstream_mlx.training.instructions import Instruction, instructions_split, task_items

from .torch_base import TorchBase, load_base


def greedy_answers(
    base: TorchBase, prompts: list[list[int]], max_tokens: int
) -> list[tuple[list[int], bool]]:
    """Each prompt's greedy answer (token ids, the end token left out) and whether it stopped
    at `max_tokens` rather than at an end token; the prompts decode as one left-padded batch."""
    eos = sorted(base.eos_token_ids)
    pad = base.tokenizer.pad_token_id
    pad = eos[0] if pad is None else pad
    width = max(len(ids) for ids in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    with torch.inference_mode():
        out = base.model.generate(
            input_ids=ids.to(base.device),
            attention_mask=mask.to(base.device),
            max_new_tokens=max_tokens,
            do_sample=False,
            temperature=None,
            top_p=None,
            top_k=None,
            eos_token_id=eos,
            pad_token_id=pad,
        )
    answers = []
    for row in out[:, width:].tolist():
        end = next((i for i, t in enumerate(row) if t in eos), None)
        answers.append((row[:end], False) if end is not None else (row[:max_tokens], True))
    return answers


def distill(
    base: TorchBase,
    items: list[Instruction],
    out_path: str | Path,
    max_tokens: int = 160,
    batch_size: int = 128,
    log=print,
    max_new: int | None = None,
) -> DistillStats:
    """Append one row per prompt of `items` not yet in out_path (the first `max_new` of them;
    None: all), a batch of similar-length prompts at a time, each batch's rows written, flushed
    and synced together."""
    out_path = Path(out_path)
    todo = still_to_answer(items, out_path, log, max_new)
    stats = DistillStats(total=len(todo))
    encoded = sorted(((base.encode_chat(it.prompt), it) for it in todo), key=lambda e: len(e[0]))
    start = time.perf_counter()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with open(out_path, "a", encoding="utf-8") as f:
        for b in range(0, len(encoded), batch_size):
            batch = encoded[b : b + batch_size]
            answers = greedy_answers(base, [ids for ids, _ in batch], max_tokens)
            for (_, item), (tokens, capped) in zip(batch, answers, strict=True):
                row = make_row(base.tokenizer, item, tokens, capped)
                f.write(json.dumps(row) + "\n")
                stats.add(row)
            f.flush()
            os.fsync(f.fileno())
            stats.seconds = time.perf_counter() - start
            log(stats.line())
    return stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    prompts = parser.add_mutually_exclusive_group(required=True)
    prompts.add_argument("--instructions", help="instructions.jsonl")
    prompts.add_argument("--chat-mix", type=int, help="N prompts of the chat mix (train splits)")
    prompts.add_argument(
        "--task", choices=sorted(TASKS), help="a writing tool's prompts for --data-file's examples"
    )
    parser.add_argument("--data-file", help="--task: its data file (for instance its train split)")
    parser.add_argument("--data", default=os.environ.get("SPECSTREAM_DATA", "../shared/data"))
    parser.add_argument("--seed", type=int, default=0, help="the chat mix's or the task's order")
    parser.add_argument(
        "--mix-kinds",
        help="the chat mix's kinds to answer: all, or a comma list (default: every kind but "
        "dialogue, DialogSum's non-commercial dialogues)",
    )
    parser.add_argument("--split", choices=["train", "dev"], default="train")
    parser.add_argument("--limit", type=int, default=None, help="the first N prompts of the split")
    parser.add_argument(
        "--max-new", type=int, default=None, help="answer at most N prompts not yet in --out"
    )
    parser.add_argument("--out", required=True, help="jsonl to append rows to (resumes)")
    parser.add_argument("--model", default=None, help="GGUF file or folder (default model)")
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    try:
        if args.batch_size < 1 or args.max_tokens < 1:
            raise SpecstreamError("--batch-size and --max-tokens must be at least 1")
        if args.data_file and args.task is None:
            raise SpecstreamError("--data-file goes with --task (the writing tool's data file)")
        if args.chat_mix is not None:
            if args.chat_mix < 1:
                raise SpecstreamError("--chat-mix must be at least 1")
            kinds = mix_kinds(args.mix_kinds)
            items = chat_mix_items(args.data, args.chat_mix, args.seed, kinds)[: args.limit]
        elif args.task is not None:
            items = task_items(args.task, args.data_file, args.seed)[: args.limit]
        else:
            items = instructions_split(args.instructions, args.split)[: args.limit]
        base = load_base(args.model, args.device)
        distill(base, items, args.out, args.max_tokens, args.batch_size, max_new=args.max_new)
    except SpecstreamError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
