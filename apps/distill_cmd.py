"""`specstream distill`: the base model's own greedy answers, as training data for lossless
streams; with a writing tool's shared adapter, that tool's own answers, for its streams."""

from __future__ import annotations

from .args import TASK_NAMES, add_model_args, output_file, positive_int
from .progress import Progress, shows_bar

HELP = "generate the base model's (or a writing tool's) greedy answers for prompts"


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("distill", help=HELP, description=HELP)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompts", help='jsonl with {"prompt": ...} rows')
    src.add_argument(
        "--chat-prompts",
        type=positive_int,
        metavar="N",
        help="build N varied chat prompts from --data-dir's train splits (the `chat` adapter "
        "mix; --mix-kinds)",
    )
    src.add_argument(
        "--instructions",
        nargs="?",
        const="",
        metavar="JSONL",
        help="the instruction prompts (default: DATA_DIR/instructions/instructions.jsonl), "
        "their --split part; rows keep each prompt's source and category",
    )
    src.add_argument(
        "--task",
        choices=TASK_NAMES,
        help="the writing tool's prompts for the examples of --data-file (a data file in the "
        "shape of ../shared/data, as `train --task`), in an order drawn by --seed",
    )
    p.add_argument("--data-file", help="--task: its data file (for instance its train split)")
    p.add_argument(
        "--adapter",
        help="a shared-mode adapter (summarize, data2text, sql or a folder): that writing tool's "
        "own answers, batched (one at a time with ss+pld where its main stream reads its "
        "streams); without it, the base model's",
    )
    p.add_argument(
        "--split",
        choices=["train", "dev"],
        default="train",
        help="--instructions: train, or the fixed dev slice that training never sees",
    )
    p.add_argument(
        "--limit", type=positive_int, default=None, help="the first N prompts of the source"
    )
    p.add_argument(
        "--data-dir", default="../shared/data", help="real data sets (default: ../shared/data)"
    )
    p.add_argument(
        "--out",
        required=True,
        help="jsonl to append rows to (an interrupted run resumes where it stopped)",
    )
    add_model_args(p)
    p.add_argument("--max-tokens", type=positive_int, default=160)
    p.add_argument("--batch-size", type=positive_int, default=32, help="sequences decoded at once")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--mix-kinds",
        help="--chat-prompts: the kinds to answer, all or a comma list (default: every kind but "
        "dialogue, DialogSum's non-commercial dialogues)",
    )
    p.add_argument(
        "--quiet", action="store_true", help="no progress bar or per-batch lines: a summary only"
    )
    p.set_defaults(run=run)


def source_prompts(args) -> list:
    """The prompts of the chosen source, as Instructions (prompt, source, category)."""
    from pathlib import Path

    import specstream_mlx as ss
    from specstream_mlx.jsonl import read_rows
    from specstream_mlx.training.chat_prompts import chat_mix_items, mix_kinds
    from specstream_mlx.training.instructions import (
        FILE,
        Instruction,
        instructions_split,
        task_items,
    )

    if args.prompts:
        rows = read_rows(args.prompts, _prompt_row, "prompts")
        if not rows:
            raise ss.SpecstreamError(f"no prompts in {args.prompts}")
        name = Path(args.prompts).name
        items = [
            Instruction(r["prompt"], str(r.get("source", name)), str(r.get("category", "")))
            for r in rows
        ]
    elif args.instructions is not None:
        items = instructions_split(args.instructions or Path(args.data_dir) / FILE, args.split)
    elif args.task:
        items = task_items(args.task, args.data_file, args.seed)
    else:
        kinds = mix_kinds(args.mix_kinds)
        items = chat_mix_items(args.data_dir, args.chat_prompts, args.seed, kinds)
    return items[: args.limit]


def _prompt_row(row) -> dict:
    from specstream_mlx.jsonl import BadRow

    if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
        raise BadRow('needs a "prompt" string')
    if not row["prompt"].strip():
        raise BadRow("the prompt is empty")
    return row


def run(args) -> int:
    from pathlib import Path

    import specstream_mlx as ss
    from specstream_mlx.training.distill import distill

    for flag, given in (("--prompts", args.prompts), ("--data-file", args.data_file)):
        if given and Path(args.out).resolve() == Path(given).resolve():
            raise ss.SpecstreamError(f"--out must differ from {flag} (rows are appended to --out)")
    if args.data_file and not args.task:
        raise ss.SpecstreamError("--data-file goes with --task (the writing tool's data file)")
    output_file(args.out, "--out", parents=True)
    prompts = source_prompts(args)
    loaded = ss.load(args.model, adapter=args.adapter, precision=args.precision)
    bar = Progress("rows", "distill", args.quiet)

    def on_row(stats):
        bar.update(
            stats.rows,
            stats.total,
            tokens_s=f"{stats.tokens_per_second:.0f}",
            capped=stats.capped,
            degenerate=stats.degenerate,
        )

    try:
        distill(
            loaded,
            prompts,
            args.out,
            args.max_tokens,
            args.batch_size,
            log=bar.log,
            on_row=on_row,
            log_every=0 if args.quiet or shows_bar() else None,
        )
    finally:
        bar.close()
    return 0
