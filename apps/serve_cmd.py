"""`specstream serve`: the OpenAI-compatible local server (apps/server.py) on one loaded base
model with its adapters."""

from __future__ import annotations

import sys

from .args import add_model_args, positive_int

HELP = "serve an OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/models)"


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("serve", help=HELP, description=HELP)
    add_model_args(p)
    p.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1 (this machine only)")
    p.add_argument("--port", type=positive_int, default=8080, help="default 8080")
    p.add_argument(
        "--api-key", default=None, help="require `Authorization: Bearer KEY` on every request"
    )
    p.add_argument(
        "--adapter",
        action="append",
        default=[],
        metavar="NAME=FOLDER",
        help="also serve this adapter folder under NAME (repeatable); the shipped adapters are "
        "served for the default model",
    )
    p.add_argument("--max-tokens", type=positive_int, default=2048, help="per request (2048)")
    p.add_argument(
        "--max-body", type=positive_int, default=1_000_000, help="request size limit in bytes"
    )
    p.add_argument(
        "--max-resident", type=positive_int, default=8, help="adapters kept in memory (LRU)"
    )
    p.set_defaults(run=run)


def run(args) -> int:
    import specstream_mlx as ss

    try:
        import uvicorn

        from .server import Limits, create_app
    except ImportError as exc:
        raise ss.SpecstreamError(
            f"the server needs its extra: pip install 'specstream-mlx[serve]' ({exc})"
        ) from None
    from specstream_mlx.manager import AdapterManager

    extra = {}
    for item in args.adapter:
        name, sep, folder = item.partition("=")
        if not sep or not name.strip() or not folder.strip():
            raise ss.SpecstreamError(f"--adapter wants NAME=FOLDER, got {item!r}")
        extra[name.strip()] = folder.strip()
    loaded = ss.load(args.model, precision=args.precision)
    manager = AdapterManager(loaded, max_resident=args.max_resident)
    for name, folder in extra.items():
        manager.register(name, folder)
    limits = Limits(max_body_bytes=args.max_body, max_tokens=args.max_tokens)
    app = create_app(manager, api_key=args.api_key, limits=limits)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"specstream serve: listening on {args.host}: reachable from other machines",
              file=sys.stderr)  # fmt: skip
    print(
        f"specstream serve: {loaded.name} with adapters {', '.join(manager.names()) or 'none'} "
        f"on http://{args.host}:{args.port}/v1",
        file=sys.stderr,
    )
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    except (OSError, SystemExit) as exc:
        raise ss.SpecstreamError(f"cannot serve on {args.host}:{args.port}: {exc}") from None
    finally:
        app.state.worker.stop()
    return 0
