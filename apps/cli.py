"""The `specstream` console script: subcommands, and one place that turns errors into messages."""

from __future__ import annotations

import os
import sys

from . import (
    bench_cmd,
    calibrate_cmd,
    chat_cmd,
    convert_cmd,
    distill_cmd,
    export_cmd,
    generate_cmd,
    serve_cmd,
    train_cmd,
    write_cmd,
)
from .args import Parser

SUBCOMMANDS = (
    generate_cmd,
    chat_cmd,
    write_cmd,
    serve_cmd,
    export_cmd,
    convert_cmd,
    distill_cmd,
    train_cmd,
    bench_cmd,
    calibrate_cmd,
)


def build_parser() -> Parser:
    parser = Parser(
        prog="specstream",
        description="Speculative Streaming on MLX: fast single-model speculative decoding.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for module in SUBCOMMANDS:
        module.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    from specstream_mlx import SpecstreamError

    try:
        return args.run(args)
    except SpecstreamError as exc:
        print(f"specstream {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `specstream generate ... | head -1`
        return 0


if __name__ == "__main__":
    sys.exit(main())
