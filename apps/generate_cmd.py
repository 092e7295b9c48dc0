"""`specstream generate`: one prompt in, text out (streamed), or one JSON object with --json."""

from __future__ import annotations

import json
import sys

from .args import add_model_args, non_negative_int, positive_int, probability, temperature

HELP = "generate text for one prompt"


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("generate", help=HELP, description=HELP)
    p.add_argument("--prompt", required=True, help="the prompt text, or - to read it from stdin")
    add_model_args(p)
    p.add_argument("--decoder", choices=["ar"], default="ar", help="ar: plain decoding")
    p.add_argument("--max-tokens", type=positive_int, default=256, help="default: 256")
    p.add_argument("--temp", type=temperature, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=probability, default=1.0, help="nucleus mass in (0, 1]")
    p.add_argument("--top-k", type=non_negative_int, default=0, help="0 = no top-k cut")
    p.add_argument("--seed", type=int, default=None, help="seed for sampling")
    p.add_argument(
        "--raw", action="store_true", help="feed the prompt as is, without the chat template"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(run=run)


def run(args) -> int:
    import specstream_mlx as ss

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    sampling = ss.SamplingParams(args.temp, args.top_p, args.top_k, args.seed)
    if not prompt.strip():
        raise ss.SpecstreamError("the prompt is empty")
    loaded = ss.load(args.model, precision=args.precision)
    chat = False if args.raw else None
    if args.json:
        result = ss.generate(
            loaded,
            prompt,
            max_tokens=args.max_tokens,
            sampling=sampling,
            decoder=args.decoder,
            chat=chat,
        )
        print(json.dumps(result.to_json(), ensure_ascii=False))
        return 0
    stats = None
    for chunk in ss.stream_generate(
        loaded,
        prompt,
        max_tokens=args.max_tokens,
        sampling=sampling,
        decoder=args.decoder,
        chat=chat,
    ):
        sys.stdout.write(chunk.text)
        sys.stdout.flush()
        stats = chunk.stats
    sys.stdout.write("\n")
    sys.stdout.flush()
    s = stats.to_dict()
    print(
        f"[{args.decoder}] {s['generated_tokens']} tokens, {s['tokens_per_second']} tokens/s, "
        f"{s['forward_passes']} forward passes, {s['mean_accepted_tokens']} tokens/pass, "
        f"prompt {s['prompt_tokens']} tokens in {s['prompt_seconds']} s",
        file=sys.stderr,
    )
    return 0
