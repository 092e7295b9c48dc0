"""`specstream bench`: every decoding method on the same prompts, interleaved, in one run."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .args import add_model_args, output_file, positive_int, temperature
from .progress import Progress

HELP = "benchmark decoding methods side by side (speedup, tau, quality, memory)"


def add_parser(subparsers) -> None:
    from specstream_mlx.bench.methods import METHODS
    from specstream_mlx.bench.suites import SUITES

    p = subparsers.add_parser("bench", help=HELP, description=HELP)
    p.add_argument(
        "--suite",
        required=True,
        choices=list(SUITES),
        help="specbench / mtbench: question.jsonl; chat: the held-out chat mix from a data "
        "folder; dialogsum / e2e / sql: a dev file of ../shared/data",
    )
    p.add_argument(
        "--data",
        required=True,
        help="question.jsonl, the data folder (chat), or the suite's data file",
    )
    p.add_argument("--limit", type=positive_int, default=None, help="first N questions")
    p.add_argument("--max-tokens", type=positive_int, default=128)
    p.add_argument(
        "--methods",
        default=None,
        help=f"comma-separated from {','.join(METHODS)}; must include ar, the speeds' "
        "reference (default: ar, ss, pld, mlx-lm, and medusa / lora when their folders are given)",
    )
    p.add_argument(
        "--medusa", default=None, help="Medusa heads folder (specstream train --mode medusa)"
    )
    p.add_argument(
        "--lora",
        default=None,
        help="next-token LoRA baseline folder (specstream train --mode next-token)",
    )
    p.add_argument(
        "--adapter",
        default=None,
        help="stream adapter for ss (default: the suite's shipped one: chat, summarize, "
        "data2text, sql)",
    )
    p.add_argument("--temp", type=temperature, default=0.0, help="0 = greedy (default)")
    p.add_argument(
        "--tree",
        choices=["auto", "adapter"],
        default="auto",
        help="auto (default): the draft tree chosen for this device (specstream calibrate); "
        "adapter: the adapter's own tree, no calibration",
    )
    add_model_args(p)
    p.add_argument("--json", default=None, help="write the report (schema: bench/report.py)")
    p.add_argument("--markdown", default=None, help="write the tables as markdown")
    p.add_argument("--plot", default=None, help="write speedup and tau per category (PNG)")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace existing --json / --markdown / --plot files",
    )
    p.set_defaults(run=run)


def _write(path: str, text: str) -> None:
    """Atomically: a reader never sees half a report."""
    from specstream_mlx import SpecstreamError

    out = Path(path)
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise SpecstreamError(f"cannot write {out}: {exc.strerror}") from None


def run(args) -> int:
    from specstream_mlx import SpecstreamError
    from specstream_mlx.bench.methods import METHODS
    from specstream_mlx.bench.report import markdown, plot
    from specstream_mlx.bench.run import BenchConfig, run_bench

    if args.methods is None:
        given = {"medusa": args.medusa, "lora": args.lora}
        methods = tuple(m for m in METHODS if given.get(m, True))
    else:
        methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    for path, flag in ((args.json, "--json"), (args.markdown, "--markdown"), (args.plot, "--plot")):
        output_file(path, flag)  # before the run: a finished measurement is never lost
        if path is not None and Path(path).exists() and not args.overwrite:
            raise SpecstreamError(f"{flag} {path} exists (pass --overwrite to replace it)")
    config = BenchConfig(
        suite=args.suite,
        data=args.data,
        limit=args.limit,
        max_tokens=args.max_tokens,
        methods=methods,
        adapter=args.adapter,
        temp=args.temp,
        model=args.model,
        precision=args.precision,
        medusa=args.medusa,
        lora=args.lora,
        tree=args.tree,
    )
    bar = Progress("question", "bench")
    try:
        report = run_bench(
            config, log=bar.log, progress=lambda done, total: bar.update(done, total)
        )
    finally:
        bar.close()
    if args.json:  # first: a long measurement is kept whatever happens to the table
        _write(args.json, json.dumps(report, indent=2) + "\n")
    table = markdown(report)
    print(table)
    if args.markdown:
        _write(args.markdown, table)
    if args.plot:
        plot(report, args.plot)
    return 0
