"""Text from the command line, stdin and files, checked where it enters: the tokenizer needs
valid Unicode, and undecodable bytes reach Python as lone surrogates (argv) or as
UnicodeDecodeError (stdin)."""

from __future__ import annotations

import sys


def text_problem(text: str) -> str | None:
    """Why `text` is not valid UTF-8 text (a lone surrogate: an undecodable byte of a
    command-line argument, which Python keeps as U+DC80-U+DCFF, or a JSON escape like \\ud800),
    or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        char = ord(text[exc.start])
        found = (
            f"undecodable byte 0x{char - 0xDC00:02x}"
            if 0xDC80 <= char <= 0xDCFF
            else f"lone surrogate U+{char:04X}"
        )
        return f"not valid UTF-8 text ({found} at character {exc.start})"
    return None


def checked_text(text: str, what: str) -> str:
    """`text` itself, or a SpecstreamError saying why it is not valid text."""
    from specstream_mlx import SpecstreamError

    problem = text_problem(text)
    if problem:
        raise SpecstreamError(f"{what} is {problem}")
    return text


def read_stdin(what: str) -> str:
    """All of stdin as UTF-8 text; binary input is a SpecstreamError, not a traceback."""
    from specstream_mlx import SpecstreamError

    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecstreamError(
            f"{what} on stdin is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
            f"{exc.start})"
        ) from None
