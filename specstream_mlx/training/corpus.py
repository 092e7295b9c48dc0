"""The distilled answers kept in the repository, so that a corpus that takes a dozen hours of
this CPU grows across sessions and machines instead of living in one machine's runs/ folder.

A shard holds distilled rows (training/distill.py) without their prompts: the prompts stay in
../shared/data (the instructions file for the train and dev splits, the chat mix's data sets for
the mix split, training/chat_prompts.py) and are never copied into the repository. Each row
carries `key`, a hash of its prompt's text; what an answer copies from its prompt (QUOTE or more
characters in a run) is kept as a reference into the prompt, and the prompt's source and
category are not kept (the prompt items have them). `unpack` joins the shards with the prompt
items to rebuild the full rows file that `specstream distill` resumes and `specstream train`
reads.

    corpus/<model>/<split>-00001.jsonl.gz, <split>-00002.jsonl.gz, ...

`pack` writes only rows that no shard holds yet, as one new shard: earlier shards never change,
so each is committed once. Shards are gzip with a zero timestamp (the same rows give the same
bytes) and are written atomically.
"""

from __future__ import annotations

import difflib
import gzip
import hashlib
import io
import json
import os
import re
from pathlib import Path

from ..errors import SpecstreamError
from ..jsonl import BadRow, read_rows
from .instructions import Instruction

SPLITS = ("train", "dev", "mix")  # the instruction prompts' splits and the chat mix
SHARD = re.compile(r"^(train|dev|mix)-(\d{5})\.jsonl\.gz$")
FIELDS = ("tokens", "capped", "loop", "loop_tail", "degenerate")  # kept as they are
QUOTE = 16  # a run of at least this many characters copied from the prompt is kept as a reference


def quote_spans(prompt: str, completion: str) -> list:
    """The completion as segments: its own text (str) and, for every run of QUOTE or more
    characters it copies from the prompt (however often, in any order), [start, end] into the
    prompt, so that no prompt text is stored."""
    match = difflib.SequenceMatcher(None, prompt, "", autojunk=False)
    match.set_seq2(completion)
    segments: list = []

    def split(lo: int, hi: int) -> None:  # completion[lo:hi], longest copied run first
        a, b, size = match.find_longest_match(0, len(prompt), lo, hi)
        if size < QUOTE:
            if hi > lo:
                segments.append(completion[lo:hi])
            return
        split(lo, b)
        segments.append([a, a + size])
        split(b + size, hi)

    split(0, len(completion))
    return segments


def unquote(prompt: str, segments: list) -> str:
    """quote_spans reversed."""
    return "".join(s if isinstance(s, str) else prompt[s[0] : s[1]] for s in segments)


def prompt_key(prompt: str) -> str:
    """What a shard row keeps of its prompt: 16 hex digits of its SHA-256."""
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:16]


def shards(corpus_dir: Path, split: str) -> list[Path]:
    """The split's shards, in order."""
    if not corpus_dir.is_dir():
        return []
    found = [p for p in corpus_dir.iterdir() if (m := SHARD.match(p.name)) and m[1] == split]
    return sorted(found)


def read_shards(corpus_dir: Path, split: str) -> dict[str, dict]:
    """key -> row (without its prompt) over every shard of the split."""
    rows: dict[str, dict] = {}
    for shard in shards(corpus_dir, split):
        try:
            text = gzip.decompress(shard.read_bytes()).decode("utf-8")
        except (OSError, EOFError, UnicodeDecodeError) as exc:
            raise SpecstreamError(f"corpus shard {shard} is damaged ({exc})") from None
        for number, line in enumerate(text.splitlines(), start=1):
            try:
                row = json.loads(line)
                rows[row["key"]] = row
            except (ValueError, KeyError, TypeError):
                raise SpecstreamError(f"corpus shard {shard}: line {number} is not a row") from None
    return rows


def _distilled(row) -> dict:
    if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
        raise BadRow('needs a "prompt" string')
    missing = [f for f in ("completion", *FIELDS) if f not in row]
    if missing:
        raise BadRow(f"missing {', '.join(missing)}")
    return row


def _complete_rows(rows_path: Path) -> list[dict]:
    """The rows of a distill output, up to its last newline: a line still being written by a
    running distillation is left for the next pack."""
    if not rows_path.is_file():
        raise SpecstreamError(f"data file not found: {rows_path}")
    data = rows_path.read_bytes()
    complete = rows_path.with_name(f".{rows_path.name}.{os.getpid()}.complete")
    complete.write_bytes(data[: data.rfind(b"\n") + 1])
    try:
        return read_rows(complete, _distilled, f"distilled rows of {rows_path}")
    finally:
        complete.unlink()


def pack(
    rows_path: Path, corpus_dir: Path, split: str, prompts: set[str] | None = None
) -> Path | None:
    """Write the rows of `rows_path` (a `specstream distill` output, which may still be growing)
    that no shard of `split` holds as the next shard; None when there are none. With `prompts`,
    only rows answering one of them (those `unpack` can rebuild) are kept."""
    have = read_shards(corpus_dir, split)
    new = []
    for row in _complete_rows(rows_path):
        key = prompt_key(row["prompt"])
        if key not in have and (prompts is None or row["prompt"] in prompts):
            have[key] = row
            text = quote_spans(row["prompt"], row["completion"])
            new.append({"key": key, "completion": text, **{f: row[f] for f in FIELDS}})
    if not new:
        return None
    existing = shards(corpus_dir, split)
    number = int(SHARD.match(existing[-1].name)[2]) + 1 if existing else 1
    shard = corpus_dir / f"{split}-{number:05d}.jsonl.gz"
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in new).encode("utf-8")
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as gz:  # mtime 0: same rows, same bytes
        gz.write(text)
    _write_atomically(shard, buffer.getvalue())
    return shard


def unpack(corpus_dir: Path, items: list[Instruction], split: str, out_path: Path) -> int:
    """Append to `out_path` the shard rows of `split` it lacks, each with its prompt, source and
    category from `items`; returns how many. Shard rows whose prompt `items` lack are left out
    (the prompts changed); rows already in `out_path` are kept as they are."""
    from .distill import read_done

    by_key = {prompt_key(i.prompt): i for i in items}
    done = read_done(out_path)
    added = []
    for key, row in read_shards(corpus_dir, split).items():
        item = by_key.get(key)
        if item is not None and item.prompt not in done:
            completion = unquote(item.prompt, row["completion"])
            added.append(
                {"prompt": item.prompt, "completion": completion, "source": item.source,
                 "category": item.category, **{f: row[f] for f in FIELDS}}
            )  # fmt: skip
    if added:
        old = out_path.read_bytes() if out_path.exists() else b""
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in added)
        _write_atomically(out_path, old + text.encode("utf-8"))
    return len(added)


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
