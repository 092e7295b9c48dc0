"""`specstream generate`: one prompt in, text out (streamed), or one JSON object with --json."""

from __future__ import annotations

import json
import sys

from .args import (
    add_model_args,
    add_sampling_args,
    add_tuning_args,
    positive_int,
    sampling_of,
    tuning_of,
)
from .text_input import checked_text, read_stdin

HELP = "generate text for one prompt"


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("generate", help=HELP, description=HELP)
    p.add_argument("--prompt", required=True, help="the prompt text, or - to read it from stdin")
    add_model_args(p)
    p.add_argument(
        "--decoder",
        choices=["ar", "ss", "pld", "ss+pld"],
        default="ar",
        help="ar: plain decoding; ss: Speculative Streaming (lossless: greedy, or sampling with "
        "--temp by tree rejection sampling); pld: prompt lookup decoding (drafts copied from the "
        "context; lossless); ss+pld: the "
        "streams' drafts plus the lookup's",
    )
    p.add_argument(
        "--adapter",
        default=None,
        help="stream adapter (shipped name or folder) for --decoder ss or ss+pld, or a "
        "shared-mode one for pld",
    )
    p.add_argument(
        "--kv-bits",
        type=int,
        choices=[4, 8],
        default=None,
        help="quantize the KV cache to 4 or 8 bits",
    )
    tree = p.add_argument_group("speculative tree (--decoder ss or ss+pld)")
    tree.add_argument(
        "--gamma",
        type=positive_int,
        default=None,
        help="streams per token (untrained streams only; default 4)",
    )
    tree.add_argument(
        "--msa-layers",
        type=positive_int,
        default=None,
        help="top layers running the streams (untrained streams only; default 4)",
    )
    tree.add_argument(
        "--tree-top-k",
        type=positive_int,
        default=None,
        help="tokens per stream in the draft tree (default 3)",
    )
    tree.add_argument(
        "--max-tree-nodes",
        type=positive_int,
        default=None,
        help="node cap after pruning (default 32)",
    )
    tree.add_argument(
        "--prune-threshold",
        type=float,
        default=None,
        help="minimum early-exit transition probability of a child (default 0)",
    )
    add_tuning_args(tree)
    p.add_argument("--max-tokens", type=positive_int, default=256, help="default: 256")
    add_sampling_args(p)
    p.add_argument(
        "--raw", action="store_true", help="feed the prompt as is, without the chat template"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument(
        "--compare",
        action="store_true",
        help="also decode plainly (--decoder ar) and report the speedup and whether the two "
        "outputs are identical (greedy: they must be, the speculative decoders are lossless; "
        "with --temp both are samples of the same distribution, not compared)",
    )
    p.set_defaults(run=run)


def run(args) -> int:
    import specstream_mlx as ss

    if args.prompt == "-":
        prompt = read_stdin("the prompt")
    else:
        prompt = checked_text(args.prompt, "--prompt")
    sampling = sampling_of(args)
    if not prompt.strip():
        raise ss.SpecstreamError("the prompt is empty")
    if args.adapter and args.decoder == "ar":
        raise ss.SpecstreamError("--adapter needs --decoder ss, ss+pld or pld")
    if args.compare and args.decoder == "ar":
        raise ss.SpecstreamError("--compare compares a speculative decoder with plain decoding")
    loaded = ss.load(args.model, adapter=args.adapter, precision=args.precision)
    if args.decoder in ("ss", "ss+pld"):
        if loaded.streams is None:  # a next-token LoRA, or no adapter at all
            print(
                f"note: {args.adapter or 'no adapter'}: no trained streams, so {args.decoder} "
                "drafts with untrained ones (they rarely guess right; `--adapter` names a "
                "stream adapter, `--decoder pld` drafts from the prompt alone)",
                file=sys.stderr,
            )
        loaded.streams = stream_params(loaded, args)
    common = dict(
        max_tokens=args.max_tokens,
        sampling=sampling,
        decoder=args.decoder,
        chat=False if args.raw else None,
        kv_bits=args.kv_bits,
        **tuning_of(args),
    )
    if args.compare:  # one-off costs (allocation, first calls) paid before either is timed
        for decoder in (args.decoder, "ar"):
            ss.generate(loaded, prompt, **{**common, "decoder": decoder, "max_tokens": 2})
    if args.json:
        result = ss.generate(loaded, prompt, **common)
        out = result.to_json()
        if args.compare:
            plain = ss.generate(loaded, prompt, **{**common, "decoder": "ar"})
            out["compare"] = compare(result.token_ids, result.stats, plain, sampling.greedy)
        print(json.dumps(out, ensure_ascii=False))
        return 0 if not args.compare or out["compare"]["identical"] is not False else 1
    tokens, stats = [], None
    for chunk in ss.stream_generate(loaded, prompt, **common):
        sys.stdout.write(chunk.text)
        sys.stdout.flush()
        tokens += chunk.token_ids
        stats = chunk.stats
    sys.stdout.write("\n")
    sys.stdout.flush()
    ran = (
        stats.decoder if stats.decoder == args.decoder else f"{stats.decoder}, asked {args.decoder}"
    )
    print(f"[{ran}] {summary(stats)}", file=sys.stderr)
    if not args.compare:
        return 0
    plain = ss.generate(loaded, prompt, **{**common, "decoder": "ar"})
    print(f"[ar] {summary(plain.stats)}", file=sys.stderr)
    c = compare(tokens, stats, plain, sampling.greedy)
    if c["identical"] is None:
        verdict = "outputs sampled (the same distribution, not compared token by token)"
    else:
        verdict = "outputs " + (
            "identical" if c["identical"] else "DIFFER (a bug: please report it)"
        )
    print(
        f"{ran} decodes {c['speedup']}x as fast as plain decoding (decode tokens/s, prompt "
        f"excluded); {verdict}",
        file=sys.stderr,
    )
    return 0 if c["identical"] is not False else 1


def summary(stats) -> str:
    s = stats.to_dict()
    return (
        f"{s['generated_tokens']} tokens, {s['tokens_per_second']} tokens/s, "
        f"{s['forward_passes']} forward passes, {s['mean_accepted_tokens']} tokens/pass, "
        f"prompt {s['prompt_tokens']} tokens in {s['prompt_seconds']} s"
    )


def compare(token_ids: list[int], stats, plain, greedy: bool = True) -> dict:
    """Decoding speed (prompt excluded) of a generation over plain decoding's (`plain`, a
    GenerationResult), and whether the two produced the same tokens (None when sampled: two
    samples of one distribution need not be equal)."""
    fast, slow = stats.tokens_per_second, plain.stats.tokens_per_second
    return {
        "speedup": round(fast / slow, 2) if slow else None,
        "plain_tokens_per_second": round(slow, 3),
        "identical": token_ids == plain.token_ids if greedy else None,
    }


def stream_params(loaded, args):
    """The adapter's streams (or untrained ones) with the tree flags applied."""
    from dataclasses import replace

    from specstream_mlx import SpecstreamError
    from specstream_mlx.generate import default_streams
    from specstream_mlx.streams.config import StreamConfig

    shape = {"gamma": args.gamma, "n_msa_layers": args.msa_layers}
    shape = {k: v for k, v in shape.items() if v is not None}
    tree = {
        "top_k": args.tree_top_k,
        "max_tree_nodes": args.max_tree_nodes,
        "prune_threshold": args.prune_threshold,
    }
    tree = {k: v for k, v in tree.items() if v is not None}
    if loaded.streams is not None:  # a trained adapter fixes gamma and the MSA layers
        fixed = loaded.streams.config
        clash = [
            f"{k}={v} (adapter has {getattr(fixed, k)})"
            for k, v in shape.items()
            if getattr(fixed, k) != v
        ]
        if clash:
            raise SpecstreamError("the adapter fixes " + ", ".join(clash))
        params = loaded.streams
    else:
        params = default_streams(loaded, StreamConfig(**shape))
    params.config = replace(params.config, **tree).validate(loaded.config["num_hidden_layers"])
    return params
