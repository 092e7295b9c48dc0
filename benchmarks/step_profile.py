"""Where a decoding step's time goes, and what compiling it (decoding/passes.py) changes.

1. Components of one eager forward pass for 1 row and for the tree's rows (context 128 tokens
   cached): the whole pass, the LM head, the 7 linear layers of every block, the attention core
   (mx.fast.scaled_dot_product_attention), RoPE, and the Python time that builds the graph.
2. Plain decoding step and Speculative Streaming pass (an adapter's tree chosen for this device),
   eager against compiled, interleaved rounds of the bare pass.
3. Whole generations (ar and ss, eager and compiled, interleaved; the first of each is a warm-up
   that pays the compilation): ms per forward pass and tokens per second.

    ./dev.sh python benchmarks/step_profile.py [--adapter chat] [--paths "0;1"] [--rounds 15]
        [--json OUT]

--paths forces a static tree (rank paths, ";"-separated, ranks "."-separated) instead of the
one chosen for this device, e.g. to profile a tree pass where no tree pays.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported
import mlx.core as mx  # noqa: E402
from specstream_mlx import calibration  # noqa: E402
from specstream_mlx.decoding.loop import make_cache  # noqa: E402
from specstream_mlx.decoding.passes import Passes  # noqa: E402
from specstream_mlx.decoding.plan import TreePlan, expected_tokens, sparse_tree  # noqa: E402
from specstream_mlx.decoding.tree import draft_tree  # noqa: E402
from specstream_mlx.decoding.tree_step import tree_forward  # noqa: E402
from specstream_mlx.models.arch import arch_of  # noqa: E402
from specstream_mlx.provenance import provenance  # noqa: E402
# isort: on

PROMPT = "Write a long, detailed story about a lighthouse keeper who finds a message in a bottle."


def interleaved(fns: dict, rounds: int) -> dict:
    return {k: round(v, 2) for k, v in calibration._interleaved_ms(fns, rounds).items()}


def components(loaded, arch, cache, rows: int, rounds: int) -> dict:
    model, layers = loaded.model, arch.layers
    tokens = mx.arange(rows)[None] + 7
    x = mx.random.normal((1, rows, arch.dims))
    x_mlp = mx.random.normal((1, rows, loaded.config["intermediate_size"]))
    rotary = arch.ropes[0].inner
    attn = layers[0].self_attn
    head_dim = arch.dims // attn.n_heads
    q = mx.random.normal((1, attn.n_heads, rows, head_dim))
    k = mx.random.normal((1, attn.n_kv_heads, 128 + rows, head_dim))
    mask = "causal" if rows > 1 else None
    mx.eval(x, x_mlp, q, k)

    def whole():
        mx.eval(model(tokens, cache=cache))
        for c in cache:
            c.trim(rows)

    def linears():
        outs = []
        for layer in layers:
            a, m = layer.self_attn, layer.mlp
            outs += [a.q_proj(x), a.k_proj(x), a.v_proj(x), a.o_proj(x)]
            outs += [m.gate_proj(x), m.up_proj(x), m.down_proj(x_mlp)]
        mx.eval(outs)

    def attention():
        sdpa = mx.fast.scaled_dot_product_attention
        mx.eval([sdpa(q, k, k, scale=0.125, mask=mask) for _ in layers])

    def rope():
        mx.eval(
            [rotary(q, offset=128) for _ in layers] + [rotary(k[:, :, :rows], 128) for _ in layers]
        )

    def head():
        mx.eval(arch.lm_head(arch.norm(x)))

    out = interleaved(
        {
            "whole pass": whole,
            "LM head": head,
            "linear layers": linears,
            "attention core": attention,
            "RoPE": rope,
        },
        rounds,
    )
    builds = []
    for _ in range(rounds):
        start = time.perf_counter()
        logits = model(tokens, cache=cache)
        builds.append((time.perf_counter() - start) * 1000)
        mx.eval(logits)
        for c in cache:
            c.trim(rows)
    out["graph building (Python)"] = round(statistics.median(builds), 2)
    return out


def passes(loaded, arch, params, plan, cache, rounds: int) -> dict:
    tree = sparse_tree(1, [[5, 6, 7, 8]] * max(plan.depth, 1), plan.paths)
    cfg = params.config
    n_streams = cfg.gamma if cfg.main_needs_streams else max(plan.depth, 1)
    compiled_plain, compiled_tree = Passes(arch), Passes(arch, params)
    token = mx.array([9])
    root = draft_tree(9, [])

    def trimmed(fn):
        def run():
            offset = cache[0].offset
            fn()
            for c in cache:
                c.trim(c.offset - offset)

        return run

    def plain_eager():
        mx.eval(loaded.model(token[None], cache=cache)[0, -1].argmax())

    def plain_compiled():
        mx.eval(compiled_plain.logits(root, cache)[0].argmax())

    def read(out):
        argmax = mx.argmax(out.main_logits, axis=-1)
        drafts = mx.argmax(
            out.stream_logits if out.stream_logits is not None else out.main_logits, -1
        )
        mx.eval(argmax, drafts)
        return argmax.tolist()

    def tree_eager():
        read(tree_forward(arch, params, tree, cache, n_streams, True))

    def tree_compiled():
        main, stream_logits = compiled_tree.logits(tree, cache, n_streams, "one")
        mx.eval(mx.argmax(main, -1), mx.argmax(stream_logits, -1))

    fns = {
        "plain step, eager": trimmed(plain_eager),
        "plain step, compiled": trimmed(plain_compiled),
        f"ss pass ({len(tree)} nodes), eager": trimmed(tree_eager),
        f"ss pass ({len(tree)} nodes), compiled": trimmed(tree_compiled),
    }
    for fn in fns.values():  # traces and compilation paid before timing
        fn()
    return interleaved(fns, rounds)


def generations(loaded, params, rounds: int, max_tokens: int) -> list[dict]:
    """ar and ss with the given streams (their tree as given: tree="adapter")."""
    runs = {(decoder, compiled): [] for decoder in ("ar", "ss") for compiled in (False, True)}
    for round_ in range(rounds + 1):
        for (decoder, compiled), results in runs.items():
            r = ss.generate(
                loaded,
                PROMPT,
                max_tokens=max_tokens,
                decoder=decoder,
                streams=params,
                compile=compiled,
                tree="adapter",
            )
            if round_:
                results.append(r)
    rows = []
    reference = runs[("ar", False)][0].token_ids
    for (_, compiled), results in runs.items():
        assert all(r.token_ids == reference for r in results), "outputs differ"
        s = [r.stats for r in results]
        decode = statistics.median(x.wall_seconds - x.prompt_seconds for x in s)
        passes_ = s[0].forward_passes - 1
        rows.append(
            {
                "decoder": s[0].decoder,
                "compiled": compiled,
                "ms_per_pass": round(decode / passes_ * 1000, 1),
                "tokens_per_second": round(statistics.median(x.tokens_per_second for x in s), 2),
                "tau": round(s[0].mean_accepted_tokens, 3),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapter", default="chat")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--generations", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--paths", default=None, help='a static tree, e.g. "0;1;0.0"')
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    loaded = ss.load(precision=args.precision, adapter=args.adapter)
    loaded.eos_token_ids.clear()  # fixed-length generations
    arch = arch_of(loaded.model, loaded.config["model_type"])
    plan = calibration.tuned(loaded, loaded.streams)
    if plan is not None:
        params = loaded.streams.with_config(
            tree=plan.paths, top_k=plan.top_k(), max_tree_nodes=plan.nodes, prune_threshold=0.0
        )
    if plan is None:
        raise SystemExit(f"{args.adapter} has no acceptance statistics (specstream calibrate)")
    if args.paths:
        paths = tuple(tuple(int(r) for r in p.split(".")) for p in args.paths.split(";"))
        acc, curve = loaded.streams.acceptance, loaded.latency_curve
        depth = max(len(p) for p in paths)
        cfg = loaded.streams.config
        plan = TreePlan(
            paths,
            expected_tokens(acc, paths),
            curve.pass_ms(len(paths) + 1, cfg.gamma if cfg.main_needs_streams else depth,
                          cfg.n_msa_layers, depth),
            curve.plain_ms,
        )  # fmt: skip
        params = loaded.streams.with_config(
            tree=paths, top_k=plan.top_k(), max_tree_nodes=plan.nodes, prune_threshold=0.0
        )
    cache = make_cache(loaded.model)
    mx.eval(loaded.model(mx.arange(128)[None] + 100, cache=cache))
    print(
        f"{loaded.name} ({loaded.precision}) on {ss.backend.device_name()}, BLAS "
        f"{ss.backend.preload_blas().library}; {args.adapter}'s tree here: {plan.paths} "
        f"({plan.nodes} nodes)"
    )
    result = {
        "device": ss.backend.device_name(),
        "precision": loaded.precision,
        "adapter": args.adapter,
        "tree": plan.to_dict(),
        "components_ms": {
            f"{r} rows": components(loaded, arch, cache, r, args.rounds)
            for r in sorted({1, plan.nodes})
        },
        "passes_ms": passes(loaded, arch, params, plan, cache, args.rounds),
        "generations": generations(loaded, params, args.generations, args.max_tokens),
        **provenance(),
    }
    for rows, parts in result["components_ms"].items():
        print(f"\n| eager pass, {rows} | ms |\n|---|---:|")
        for name, ms in parts.items():
            print(f"| {name} | {ms} |")
    print("\n| bare pass | ms |\n|---|---:|")
    for name, ms in result["passes_ms"].items():
        print(f"| {name} | {ms} |")
    print("\n| generation | compiled | ms per pass | tokens/s | tau |\n|---|---|---:|---:|---:|")
    for row in result["generations"]:
        print(
            f"| {row['decoder']} | {row['compiled']} | {row['ms_per_pass']} | "
            f"{row['tokens_per_second']} | {row['tau']} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
