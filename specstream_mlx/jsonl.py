"""Reading jsonl data files: every malformed line is reported with its number, all at once."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from .errors import SpecstreamError

T = TypeVar("T")
SHOWN = 10  # problems listed in the message; the rest are counted


def data_file(path: str | Path) -> Path:
    """`path`, once it is known to be a file: a clear error for a folder or nothing there."""
    path = Path(path)
    if path.is_dir():
        raise SpecstreamError(f"data file {path} is a folder: give the data file")
    if not path.is_file():
        raise SpecstreamError(f"data file not found: {path}")
    return path


class BadRow(ValueError):
    """A row in the wrong shape; its message is reported as it is."""


def read_rows(path: str | Path, convert: Callable[[object], T], what: str = "data") -> list[T]:
    """`convert(row)` for each non-empty line's JSON value. Lines that are not JSON, or that
    `convert` rejects (BadRow, KeyError, ValueError, TypeError, AttributeError, SpecstreamError),
    are collected and raised together as one SpecstreamError naming `what` and `path`."""
    path = data_file(path)
    rows, problems, not_json = [], [], 0
    with open(path, "rb") as f:  # decoded line by line: a binary line is one more problem
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                rows.append(convert(json.loads(raw.decode("utf-8"))))
            except UnicodeDecodeError:
                problems.append(f"line {number}: not UTF-8 text")
            except json.JSONDecodeError as exc:
                problems.append(f"line {number}: invalid JSON ({exc.msg})")
                not_json += 1
            except BadRow as exc:
                problems.append(f"line {number}: {exc}")
            except KeyError as exc:  # a field the row lacks
                problems.append(f"line {number}: no field {exc}")
            except (ValueError, TypeError, AttributeError, SpecstreamError) as exc:
                problems.append(f"line {number}: {type(exc).__name__} {exc}")
    if problems and not_json == len(problems) and not rows:
        raise SpecstreamError(
            f"{path} is not a JSON Lines file for {what} (one JSON object a line): {problems[0]}"
        )
    if problems:
        more = f"; ... {len(problems) - SHOWN} more" if len(problems) > SHOWN else ""
        raise SpecstreamError(f"malformed {what} in {path}: {'; '.join(problems[:SHOWN])}{more}")
    return rows
