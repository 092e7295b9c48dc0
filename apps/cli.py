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
    _closed_stdio()
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        late = getattr(args, "late_text", None)  # `write TOOL --opt X TEXT`: argparse leaves TEXT
        option = extra[0].startswith("-") and extra[0] != "-"  # "-": stdin
        if late is None or len(extra) > 1 or option or getattr(args, late) is not None:
            where = f" for {args.command}" if args.command else ""
            parser.error(f"unrecognized arguments{where}: {' '.join(extra)}")
        setattr(args, late, extra[0])
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


def _closed_stdio() -> None:
    """A closed stdin, stdout or stderr (`<&-`) as /dev/null: reads see an empty input and
    writes go nowhere, where Python would leave sys.stdin None and the next file opened would
    take the descriptor."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        if getattr(sys, name) is None:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            setattr(sys, name, open(fd, mode, closefd=False))  # noqa: SIM115


if __name__ == "__main__":
    sys.exit(main())
