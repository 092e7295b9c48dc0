"""`specstream write TOOL`: the writing tools (summarize, data2text, sql), each with its own
shipped adapter on the shared base model and the prompt template it was trained with."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from .args import add_model_args, positive_int
from .text_input import checked_text, read_stdin

HELP = "run a writing tool (summarize, data2text, sql) with its adapter"
INPUT_NAMES = {
    "summarize": "the dialogue",
    "data2text": "the meaning representation",
    "sql": "the question",
}
MAIN_FIELD = {"summarize": "dialogue", "data2text": "mr", "sql": "question"}


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "write",
        help=HELP,
        description=HELP + ". Input: TEXT, --file, stdin, or --input rows (jsonl) for a batch.",
    )
    p.add_argument("tool", choices=sorted(MAIN_FIELD), help="the writing tool")
    p.add_argument(
        "text",
        nargs="?",
        default=None,
        help="summarize: the dialogue; data2text: the meaning representation "
        "(name[...], food[...]); sql: the question. Default: --file, else stdin",
    )
    p.add_argument("--file", default=None, help="read TEXT from this file")
    p.add_argument(
        "--context",
        default=None,
        help="sql: the table(s) the question is about (CREATE TABLE ...); '@FILE' reads a file",
    )
    p.add_argument(
        "--input",
        default=None,
        help="batch: a jsonl file of rows with the tool's fields (summarize: dialogue; "
        "data2text: mr; sql: question, context); one JSON result per row on stdout",
    )
    p.add_argument(
        "--output",
        default=None,
        help="with --input: append the results to this jsonl file instead; rows already there "
        "are skipped, so an interrupted batch resumes",
    )
    add_model_args(p)
    p.add_argument(
        "--adapter", default=None, help="adapter folder or shipped name (default: the tool's)"
    )
    p.add_argument(
        "--decoder",
        choices=["ar", "ss", "pld", "ss+pld"],
        default="ss+pld",
        help="default ss+pld: the adapter's streams plus prompt lookup (greedy, lossless)",
    )
    p.add_argument("--max-tokens", type=positive_int, default=256, help="default: 256")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(run=run, late_text="text")  # TEXT after the options too (apps/cli.py)


def run(args) -> int:
    import specstream_mlx as ss
    from specstream_mlx.tasks import get_task

    task = get_task(args.tool)
    if args.output and not args.input:
        raise ss.SpecstreamError("--output is for batches: give --input ROWS.jsonl too")
    if args.input and (args.text is not None or args.file):
        raise ss.SpecstreamError("give either --input rows or one TEXT / --file, not both")
    if args.input:
        rows = read_batch(args.input, task)
        prompts = None  # checked row by row below, with their line numbers
        done = rows_done(Path(args.output), rows) if args.output else 0  # before the model loads
    else:
        fields = {MAIN_FIELD[args.tool]: read_text(args)}
        if args.tool == "sql":
            fields["context"] = read_context(args.context)
        prompts = [task.prompt(**fields)]
    loaded = ss.load(args.model, adapter=args.adapter or args.tool, precision=args.precision)
    common = dict(max_tokens=args.max_tokens, decoder=args.decoder)
    if prompts is not None:
        return write_one(ss, loaded, prompts[0], common, args)
    return write_batch(ss, loaded, rows, common, args.output, done)


def read_text(args) -> str:
    from specstream_mlx import SpecstreamError

    what = INPUT_NAMES[args.tool]
    if args.text is not None and args.file:
        raise SpecstreamError("give TEXT or --file, not both")
    if args.file:
        try:
            text = Path(args.file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecstreamError(f"cannot read {args.file}: {exc}") from None
    elif args.text is not None and args.text != "-":
        text = checked_text(args.text, "TEXT")
    elif args.text == "-" or not sys.stdin.isatty():
        text = read_stdin(what)
    else:
        raise SpecstreamError(f"no input: give {what} as TEXT, --file, or on stdin")
    if not text.strip():
        raise SpecstreamError(f"the input is empty: give {what}")
    return text


def read_context(context: str | None) -> str:
    from specstream_mlx import SpecstreamError

    if not context or not context.strip():
        raise SpecstreamError("sql needs --context: the table(s), e.g. 'CREATE TABLE t (a INT)'")
    if context.startswith("@"):
        try:
            return Path(context[1:]).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecstreamError(f"cannot read {context[1:]}: {exc}") from None
    return checked_text(context, "--context")


def read_batch(path: str, task) -> list[str]:
    """The prompt of every row; every malformed row reported at once, with its line number."""
    from specstream_mlx import SpecstreamError
    from specstream_mlx.jsonl import BadRow, read_rows

    def prompt(row) -> str:
        if not isinstance(row, dict):
            raise BadRow(f"expected an object with {', '.join(task.fields)}")
        wrong = [f for f in task.fields if not isinstance(row.get(f, ""), str)]
        if wrong:  # {"mr": 5} is a mistake in the row, not the text "5"
            raise BadRow(f"{', '.join(wrong)} must be text")
        try:
            return checked_text(task.prompt(**{f: row.get(f, "") for f in task.fields}), "the row")
        except SpecstreamError as exc:
            raise BadRow(str(exc)) from None

    prompts = read_rows(path, prompt, what=f"{task.name} rows")
    if not prompts:
        raise SpecstreamError(f"no rows in {path}")
    return prompts


def write_one(ss, loaded, prompt: str, common: dict, args) -> int:
    if args.json:
        result = ss.generate(loaded, prompt, **common)
        print(json.dumps(result.to_json(), ensure_ascii=False))
        return 0
    stats = None
    for chunk in ss.stream_generate(loaded, prompt, **common):
        sys.stdout.write(chunk.text)
        sys.stdout.flush()
        stats = chunk.stats
    sys.stdout.write("\n")
    s = stats.to_dict()
    print(
        f"[{s['decoder']}, {loaded.adapter}] {s['generated_tokens']} tokens, "
        f"{s['tokens_per_second']} tokens/s, {s['mean_accepted_tokens']} tokens/pass",
        file=sys.stderr,
    )
    return 0


def rows_done(output: Path, prompts: list[str]) -> int:
    """Rows already in the --output file (0 for a new file), checked before the model loads: a
    folder, a missing parent folder, or a file that is not this batch's jsonl (rows written for
    other prompts included) is an error."""
    from specstream_mlx import SpecstreamError

    if output.is_dir():
        raise SpecstreamError(f"--output {output} is a folder: give a file")
    if not output.parent.is_dir():
        raise SpecstreamError(f"--output {output}: no folder {output.parent}")
    try:
        return _complete_lines(output, prompts)
    except UnicodeDecodeError:
        raise SpecstreamError(
            f"--output {output} is not a text file (not this batch's output): give another"
        ) from None
    except OSError as exc:
        raise SpecstreamError(f"cannot read --output {output}: {exc.strerror}") from None


def write_batch(
    ss, loaded, prompts: list[str], common: dict, output: str | None, done: int = 0
) -> int:
    """One JSON line per row ({"row", "text", "stats"}), to stdout or appended to `output`
    after its first `done` rows."""
    try:
        out = open(output, "a", encoding="utf-8") if output else sys.stdout  # noqa: SIM115
    except OSError as exc:
        raise ss.SpecstreamError(f"cannot write --output {output}: {exc.strerror}") from None
    try:
        for row, prompt in enumerate(prompts[done:], start=done + 1):
            result = ss.generate(loaded, prompt, **common)
            line = {
                "row": row,
                "text": result.text,
                "stats": result.stats.to_dict(),
                "input": input_digest(prompt),
            }
            out.write(json.dumps(line, ensure_ascii=False) + "\n")
            out.flush()
            if output:
                os.fsync(out.fileno())
                print(f"row {row}/{len(prompts)}", file=sys.stderr)
    finally:
        if output:
            out.close()
    if done:
        print(f"resumed: rows 1-{done} were already in {output}", file=sys.stderr)
    return 0


def input_digest(prompt: str) -> str:
    """What an output row records of its prompt, so a resume can tell another batch's rows."""
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:16]


def _complete_lines(path: Path, prompts: list[str]) -> int:
    """Rows already written to `path` (rows 1..n in order, each for the prompt of its row). A
    last line cut short by an interruption (no newline after it) is removed, atomically; any
    other damage, or rows that are not 1..n of these prompts, stop the run with the file left as
    it is."""
    from specstream_mlx import SpecstreamError

    if not path.exists():
        return 0
    text = path.read_text(encoding="utf-8")
    complete, _, cut = text.rpartition("\n")
    lines = complete.split("\n") if complete else []
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line)
            row, digest = record["row"], record.get("input")
        except (ValueError, KeyError, TypeError, AttributeError):
            row = digest = None
        if row != number:
            raise SpecstreamError(
                f"{path} line {number} is not result row {number}: not this batch's output, or "
                "damaged; give another --output"
            )
        if number > len(prompts) or digest not in (None, input_digest(prompts[number - 1])):
            raise SpecstreamError(
                f"{path} row {number} was written for another input than row {number} of "
                "--input: another batch's output; give another --output"
            )
    if cut:  # interrupted while writing: that row runs again
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(complete + "\n" if complete else "")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    return len(lines)
