"""`specstream calibrate`: measure this device's latency curve (cached) and show, or measure, the
draft tree an adapter gets here."""

from __future__ import annotations

import json
import sys

from .args import add_model_args, output_file, positive_int
from .progress import Progress

HELP = "measure this device's forward latency curve and choose adapters' draft trees"


def add_parser(subparsers) -> None:
    from specstream_mlx.bench.suites import SUITES

    p = subparsers.add_parser("calibrate", help=HELP, description=HELP)
    add_model_args(p)
    p.add_argument("--adapter", default=None, help="show the tree this adapter gets here")
    p.add_argument(
        "--force", action="store_true", help="measure the curve again (default: use the cache)"
    )
    p.add_argument(
        "--measure-acceptance",
        action="store_true",
        help="decode prompts with the adapter and write its acceptance statistics "
        "(acceptance.json in the adapter folder, atomically; an existing one is replaced only "
        "with --overwrite)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="--measure-acceptance replaces the adapter's acceptance.json (what its planner reads)",
    )
    p.add_argument(
        "--suite",
        choices=list(SUITES),
        default=None,
        help="prompts for --measure-acceptance (default: the suite of a shipped adapter)",
    )
    p.add_argument("--data", default=None, help="the suite's data file or folder")
    p.add_argument("--limit", type=positive_int, default=24, help="prompts (default 24)")
    p.add_argument(
        "--skip",
        type=int,
        default=40,
        help="suite items skipped first, so that benchmarks on the first 40 stay unseen "
        "(default 40)",
    )
    p.add_argument("--max-tokens", type=positive_int, default=128)
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    p.set_defaults(run=run)


def run(args) -> int:
    import specstream_mlx as ss
    from specstream_mlx import calibration
    from specstream_mlx.provenance import provenance
    from specstream_mlx.streams.acceptance import describe_rates
    from specstream_mlx.streams.adapter_io import resolve_adapter

    if args.measure_acceptance and not args.adapter:
        raise ss.SpecstreamError("--measure-acceptance needs --adapter")
    if args.skip < 0:
        raise ss.SpecstreamError(f"--skip must be >= 0, got {args.skip}")
    loaded = ss.load(args.model, adapter=args.adapter, precision=args.precision)
    folder = prompts = None
    if args.adapter and loaded.streams is None:  # before timing anything, as the checks below
        raise ss.SpecstreamError(f"{args.adapter} has no speculative streams")
    if args.adapter and args.measure_acceptance:  # bad arguments fail before minutes of timing
        folder = resolve_adapter(args.adapter, loaded)
        output_file(str(folder / "acceptance.json"), "--measure-acceptance")
        if (folder / "acceptance.json").exists() and not args.overwrite:
            raise ss.SpecstreamError(
                f"{folder / 'acceptance.json'} exists: its statistics are what the planner "
                "reads (pass --overwrite to replace them)"
            )
        prompts = _prompts(args, folder.name)
    log = (lambda s: None) if args.json else (lambda s: print(s, file=sys.stderr, flush=True))
    curve = calibration.read_curve(loaded)
    cached = curve is not None and curve.steady and not args.force  # provisional: measured again
    if not cached:
        log(f"measuring the latency curve of {loaded.name} ({loaded.precision}) on this device")
        bar, stages = Progress("stage", "calibrate", args.json), calibration.CURVE_STAGES
        curve = calibration.measure_curve(
            loaded, on_stage=lambda i: bar.update(i, len(stages), stage=stages[i])
        )
        bar.update(len(stages), len(stages), stage="done")
        bar.close()
        try:
            calibration.cache_curve(loaded, curve)
        except OSError as exc:
            path = calibration.curve_path(loaded)
            raise ss.SpecstreamError(f"cannot write {path}: {exc}") from None
    loaded.latency_curve = curve
    out = {"curve": curve.to_dict(), "curve_file": str(calibration.curve_path(loaded))}
    out["cached"] = True
    out["steady"] = curve.steady  # false: measured on a busy machine, cached as provisional
    out["provenance"] = provenance()  # the commit and versions of this run, the machine
    if args.adapter:
        params = loaded.streams
        if args.measure_acceptance:
            bar = Progress("prompt", "acceptance", args.json)
            params.acceptance = calibration.measure_acceptance(
                loaded,
                params,
                prompts,
                args.max_tokens,
                source=f"greedy decoding of {len(prompts)} {args.suite or folder.name} prompts "
                f"(items {args.skip}-{args.skip + len(prompts) - 1}), {args.max_tokens} tokens max",
                on_prompt=lambda done, total, n: bar.update(done, total, positions=n),
            )
            bar.close()
            path = folder / "acceptance.json"
            _write(path, params.acceptance.to_dict())
            log(f"wrote {path} ({params.acceptance.positions} positions)")
        if params.acceptance is not None:
            out["acceptance"] = params.acceptance.rates()
        plan = calibration.plan_tree(loaded, params, curve)
        if plan is None:
            out["tree"] = None
            log(
                f"{args.adapter} has no acceptance statistics: it drafts its own tree "
                "(measure them with --measure-acceptance)"
            )
        else:
            out["tree"] = {**plan.to_dict(), "candidates": plan.candidates}
    if args.json:
        print(json.dumps(out))
        return 0
    print(
        f"{curve.model} ({curve.precision}) on {curve.device}: "
        f"{'cached' if cached else 'measured in ' + str(curve.measured_seconds) + ' s'}, "
        f"{out['curve_file']}"
    )
    print("| rows in flight | forward ms (all layers + head) | x 1 row |")
    print("|---:|---:|---:|")
    one = curve.n_layers * curve.layer_ms[0] + curve.head_ms[0]
    for r, layer, head in zip(curve.rows, curve.layer_ms, curve.head_ms, strict=True):
        ms = curve.n_layers * layer + head
        print(f"| {r} | {ms:.1f} | {ms / one:.2f} |")
    mode = "compiled" if curve.compiled else "eager"
    print(f"{mode} passes (faster here); in the decoding loop, ms per pass:")
    depths = [curve.msa_ref] + ([curve.msa_deep] if curve.loop_deep_ms else [])
    loops = [curve.loop_ms] + ([curve.loop_deep_ms] if curve.loop_deep_ms else [])
    head = " | ".join(f"ms, streams in {d} MSA layers | x plain step" for d in depths)
    print(f"| tree nodes (one stream each) | {head} |\n|---:|" + "---:|---:|" * len(depths))
    print("| plain decoding |" + f" {curve.plain_ms:.1f} | 1.00 |" * len(depths))
    for i, nodes in enumerate(curve.loop_nodes):
        cells = "".join(
            f" {ms[i]:.1f} | {ms[i] / curve.plain_ms:.2f} |" if i < len(ms) else " | |"
            for ms in loops
        )
        print(f"| {nodes} |{cells}")
    print(
        f"a tree per bin of stream 1's confidence waits for it: {curve.gated_ms:.1f} ms more "
        "a pass than a static tree"
    )
    if "acceptance" in out:
        print(describe_rates(out["acceptance"]))
    tree = out.get("tree")
    if tree:
        print(describe_tree(args.adapter, tree, curve.drift))
    return 0


def describe_tree(adapter: str, tree: dict, drift: float) -> str:
    """The calibrated tree in a sentence, or why none was chosen."""
    from specstream_mlx.decoding.plan import MIN_GAIN

    bar = f"a tree must promise {tree['required_speedup']}x"
    if 1 + drift > MIN_GAIN:  # the curve's drift set the bar (calibration.required_gain)
        bar += f": the curve's timings moved {drift:.0%} while it was measured"
    if not tree["paths"]:
        best = max((c for c in tree["candidates"] if c[0] > 1), key=lambda c: c[2], default=None)
        why = f"the best, {best[0]} nodes, is predicted at {best[2]}x" if best else "none drafts"
        return f"{adapter}: no tree pays here ({why}; {bar}): `ss` decodes plainly"
    shape = f"tree of {tree['nodes']} nodes, depth {tree['depth']}, paths {tree['paths']}"
    if tree.get("bin_trees"):
        bins = "; ".join(
            f"{1 + len(paths)} nodes {paths} from {low}" if paths else f"the root alone from {low}"
            for low, paths in zip([0.0, *tree["gates"]], tree["bin_trees"], strict=True)
        )
        shape = f"a tree per bin of stream 1's confidence ({bins})"
    return (
        f"{adapter}: {shape}: {tree['expected_tokens_per_pass']} tokens per pass expected, "
        f"{tree['predicted_pass_ms']} ms per pass, predicted {tree['predicted_speedup']}x "
        f"plain decoding ({bar})"
    )


def _write(path, data: dict) -> None:
    from specstream_mlx import SpecstreamError
    from specstream_mlx.calibration import write_json_atomic

    try:
        write_json_atomic(path, data)
    except OSError as exc:
        raise SpecstreamError(f"cannot write {path}: {exc}") from None


def _prompts(args, adapter_name: str) -> list[str]:
    from specstream_mlx import SpecstreamError
    from specstream_mlx.bench.suites import SUITES, read_suite

    suite = args.suite
    if suite is None:
        by_adapter = {a: s for s, (_, a) in SUITES.items() if s not in ("specbench", "mtbench")}
        suite = by_adapter.get(adapter_name)
        if suite is None:
            raise SpecstreamError("--measure-acceptance needs --suite and --data for this adapter")
        args.suite = suite
    if args.data is None:
        raise SpecstreamError("--measure-acceptance needs --data (the suite's data file or folder)")
    questions = read_suite(suite, args.data, args.skip + args.limit)[args.skip :]
    if not questions:
        raise SpecstreamError(f"{args.data} has no items after the first {args.skip}")
    return [q.turns[0] for q in questions]
