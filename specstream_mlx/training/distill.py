"""Distillation data: a model's own greedy answers (the base's, or a writing tool's: the base
with a shared-mode adapter's LoRA), generated with continuous batching (many sequences per
forward pass cost far less per token on a CPU than one at a time; a finished sequence's slot is
refilled at once, so no batch waits for its longest answer); a tool whose main stream attends to
its streams has its answers decoded one at a time by our loop.

Output rows, one JSON object a line:
    {"prompt", "completion", "source", "category", "tokens", "capped", "loop", "loop_tail",
     "degenerate"}
`tokens` counts the answer's tokens, `capped` is true when it stopped at max_tokens rather than
at an end token, `loop` and `loop_tail` are how much of it and of its second half is a loop
(training/degenerate.py), and `degenerate` marks rows that training readers skip (they stay in
the file so that a resume does not generate them again).
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecstreamError
from ..prompts import encode_prompt
from .degenerate import find_loop
from .instructions import Instruction


@dataclass
class DistillStats:
    """What a distill call has done so far (rows written by this call only)."""

    total: int  # rows this call set out to write
    rows: int = 0
    tokens: int = 0  # answer tokens
    capped: int = 0
    degenerate: int = 0
    seconds: float = 0.0

    def add(self, row: dict) -> None:
        """Count a written row."""
        self.rows += 1
        self.tokens += row["tokens"]
        self.capped += row["capped"]
        self.degenerate += row["degenerate"]

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def line(self) -> str:
        eta = (self.total - self.rows) / self.rows_per_second if self.rows else float("nan")
        return (
            f"distill: {self.rows}/{self.total} rows, {self.tokens} answer tokens in "
            f"{self.seconds:.0f} s ({self.rows_per_second:.3f} rows/s, "
            f"{self.tokens_per_second:.1f} tokens/s), {self.capped} capped, "
            f"{self.degenerate} degenerate, ETA {_duration(eta)}"
        )


def _duration(seconds: float) -> str:
    if seconds != seconds:  # nan
        return "?"
    minutes = int(seconds // 60)
    return f"{minutes // 60}h{minutes % 60:02d}m"


def distill(
    loaded,
    prompts: Iterable[Instruction | str],
    out_path: str | Path,
    max_tokens: int = 160,
    batch_size: int = 32,
    log: Callable[[str], None] = print,
    on_row: Callable[[DistillStats], None] | None = None,
    log_every: int | None = None,
) -> DistillStats:
    """Append one row per prompt to out_path (module docstring); prompts already there are
    skipped, so an interrupted run resumes, and a partial last line is cut off first. Each row
    is written as one whole line and flushed when its answer ends (synced to disk every
    `batch_size` rows): a crash loses only the answers in flight. `batch_size` sequences of
    `loaded.model` decode together (a shared-mode adapter's LoRA is on it), except with
    an adapter whose main stream attends to its streams (which batched decoding does not run):
    its own answers are decoded one at a time. `on_row(stats)` follows every row; `log` gets a
    line every `log_every` rows (default: batch_size; 0: only the first and last lines)."""
    items = [Instruction(p, "", "") if isinstance(p, str) else p for p in prompts]
    out_path = Path(out_path)
    todo = still_to_answer(items, out_path, log)
    stats = DistillStats(total=len(todo))
    every = batch_size if log_every is None else log_every
    if not todo:
        return stats
    main_reads = loaded.streams is not None and loaded.streams.config.main_needs_streams
    if main_reads:
        answers = _own_answers(loaded, todo, max_tokens)
    else:
        answers = _batched_answers(loaded, todo, max_tokens, batch_size)
    start = time.perf_counter()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with open(out_path, "a", encoding="utf-8") as f:
        with closing(answers) as answered:
            for item, tokens, capped in answered:
                row = make_row(loaded.tokenizer, item, tokens, capped)
                f.write(json.dumps(row) + "\n")
                f.flush()
                stats.add(row)
                stats.seconds = time.perf_counter() - start
                if stats.rows % batch_size == 0:
                    os.fsync(f.fileno())
                if on_row:
                    on_row(stats)
                if every and stats.rows % every == 0 and stats.rows < stats.total:
                    log(stats.line())
        os.fsync(f.fileno())
    log(stats.line())
    return stats


Answer = tuple[Instruction, list[int], bool]  # the prompt, its answer's ids, capped


def _batched_answers(
    loaded, todo: list[Instruction], max_tokens: int, batch_size: int
) -> Iterator[Answer]:
    """`loaded.model`'s greedy answers, `batch_size` sequences at a time (mlx-lm's
    BatchGenerator: a finished answer's slot takes the next prompt at once), as they end. The
    prompts go in longest first: a prefill batch is padded to its longest prompt, so prompts of
    like length together waste little of it on a mixed set such as sql's (short WikiSQL
    tables, long Spider schemas), and the slowest rows come while the estimate is still rough."""
    from mlx_lm.generate import BatchGenerator

    gen = BatchGenerator(
        loaded.model,
        stop_tokens=[[t] for t in sorted(loaded.eos_token_ids)],
        completion_batch_size=batch_size,
        prefill_batch_size=min(batch_size, 8),
    )
    encoded = [(encode_prompt(loaded, it.prompt), it) for it in todo]
    queue = deque(sorted(encoded, key=lambda e: -len(e[0])))  # stable: ties keep their order
    pending = {}  # uid -> (item, answer tokens so far)
    try:
        while queue or pending:
            if queue and len(pending) < 2 * batch_size:  # keep the next slots' prompts ready
                chunk = [queue.popleft() for _ in range(min(batch_size, len(queue)))]
                uids = gen.insert([ids for ids, _ in chunk], [max_tokens] * len(chunk))
                pending.update({u: (it, []) for u, (_, it) in zip(uids, chunk, strict=True)})
            responses = gen.next_generated()
            if not responses and not queue:  # nothing left to decode, answers unfinished
                raise SpecstreamError(f"the generator stopped with {len(pending)} in flight")
            for r in responses:
                item, tokens = pending[r.uid]
                if r.finish_reason != "stop":  # the end token itself is not kept
                    tokens.append(r.token)
                if r.finish_reason is not None:
                    del pending[r.uid]
                    yield item, tokens, r.finish_reason == "length"
    finally:
        gen.close()


def _own_answers(loaded, todo: list[Instruction], max_tokens: int) -> Iterator[Answer]:
    """The greedy answers of `loaded` with its adapter, one prompt at a time, decoded by
    `ss+pld`: exactly the tokens of its plain decoding, sooner."""
    from ..generate import generate

    for item in todo:
        result = generate(loaded, item.prompt, max_tokens=max_tokens, decoder="ss+pld")
        yield item, result.token_ids, result.finish_reason == "length"


def still_to_answer(
    items: list[Instruction], out_path: Path, log=print, limit: int | None = None
) -> list[Instruction]:
    """The first `limit` (None: all) items whose prompt out_path does not answer yet (the first
    of repeated prompts), in order; logs how many are done and how many to go."""
    done = read_done(out_path)
    todo, seen = [], set(done)
    for it in items:
        if it.prompt not in seen:
            seen.add(it.prompt)
            todo.append(it)
    todo = todo[:limit]
    log(f"distill: {len(done)} rows in {out_path}, {len(todo)} to generate")
    return todo


def make_row(tokenizer, item: Instruction, tokens: list[int], capped: bool) -> dict:
    """One output row for an answer (its token ids, the end token left out)."""
    completion = tokenizer.decode(tokens)
    loop = find_loop(completion)
    return {
        "prompt": item.prompt,
        "completion": completion,
        "source": item.source,
        "category": item.category,
        "tokens": len(tokens),
        "capped": capped,
        "loop": round(loop.whole, 3),
        "loop_tail": round(loop.tail, 3),
        "degenerate": loop.degenerate,
    }


def read_done(out_path: Path) -> set[str]:
    """Prompts already answered in out_path. A partial last line (an interrupted write) is cut
    off; any other malformed line is an error, never silently dropped."""
    if not out_path.exists():
        return set()
    data = out_path.read_bytes()
    *lines, tail = data.split(b"\n")  # tail: bytes after the last newline
    bad = [n for n, ln in enumerate(lines, 1) if ln.strip() and not _is_row(ln)]
    if bad:
        raise SpecstreamError(
            f"malformed rows in {out_path} (lines {bad[:10]}): fix or move the file; nothing "
            "was changed"
        )
    if tail.strip():
        with open(out_path, "r+b") as f:
            f.truncate(len(data) - len(tail))
    return {json.loads(ln)["prompt"] for ln in lines if ln.strip()}


def _is_row(line: bytes) -> bool:
    try:
        row = json.loads(line)
    except ValueError:
        return False
    return isinstance(row, dict) and "prompt" in row and "completion" in row
