"""`specstream distill`: the base model's own greedy answers, as training data for lossless
streams."""

from __future__ import annotations

import sys

from .args import add_model_args, positive_int

HELP = "generate the base model's greedy answers for prompts (batched)"


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("distill", help=HELP, description=HELP)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompts", help='jsonl with {"prompt": ...} rows')
    src.add_argument(
        "--chat-prompts",
        type=positive_int,
        metavar="N",
        help="build N varied chat prompts from --data-dir (the `chat` adapter mix)",
    )
    p.add_argument(
        "--data-dir", default="../shared/data", help="real data sets (default: ../shared/data)"
    )
    p.add_argument(
        "--out",
        required=True,
        help="jsonl to append prompt+completion rows to (an interrupted run resumes)",
    )
    add_model_args(p)
    p.add_argument("--max-tokens", type=positive_int, default=160)
    p.add_argument("--batch-size", type=positive_int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=run)


def run(args) -> int:
    import specstream_mlx as ss
    from specstream_mlx.training.chat_prompts import build_chat_prompts
    from specstream_mlx.training.data import read_jsonl
    from specstream_mlx.training.distill import distill

    if args.prompts:
        rows = read_jsonl(args.prompts)
        missing = [i for i, r in enumerate(rows, 1) if not isinstance(r.get("prompt"), str)]
        if missing:
            raise ss.SpecstreamError(f"rows without a prompt string: {missing[:10]}")
        prompts = [r["prompt"] for r in rows]
    else:
        prompts = build_chat_prompts(args.data_dir, args.chat_prompts, args.seed)
    loaded = ss.load(args.model, precision=args.precision)
    distill(
        loaded,
        prompts,
        args.out,
        args.max_tokens,
        args.batch_size,
        log=lambda s: print(s, file=sys.stderr, flush=True),
    )
    return 0
