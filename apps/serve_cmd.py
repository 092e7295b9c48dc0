"""`specstream serve`: the OpenAI-compatible local server (apps/server.py) on one loaded base
model with its adapters."""

from __future__ import annotations

import argparse
import os
import socket
import sys

from .args import add_model_args, positive_int, tcp_port

HELP = "serve an OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/models)"


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("serve", help=HELP, description=HELP)
    add_model_args(p)
    p.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1 (this machine only)")
    p.add_argument("--port", type=tcp_port, default=8080, help="default 8080")
    p.add_argument(
        "--api-key",
        default=os.environ.get("SPECSTREAM_API_KEY") or None,
        help="require `Authorization: Bearer KEY` on every request (default: the "
        "SPECSTREAM_API_KEY environment variable, which keeps the key out of the process list)",
    )
    p.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="without an API key, also accept requests whose Host header is NAME (repeatable; * "
        "accepts any), e.g. this machine's LAN name with --host 0.0.0.0. By default only the "
        "--host address, localhost, 127.0.0.1 and [::1] are accepted, so that no web page can "
        "reach the server through a name of its own (DNS rebinding)",
    )
    p.add_argument(
        "--adapter",
        action="append",
        default=[],
        metavar="NAME=FOLDER",
        help="also serve this adapter folder under NAME (repeatable); the shipped adapters "
        "made for the model are served too",
    )
    p.add_argument("--max-tokens", type=positive_int, default=2048, help="per request (2048)")
    p.add_argument(
        "--max-body", type=positive_int, default=1_000_000, help="request size limit in bytes"
    )
    p.add_argument(
        "--max-resident", type=positive_int, default=8, help="adapters kept in memory (LRU)"
    )
    p.add_argument(
        "--keep-fused",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep each resident adapter's fused weights, so that swapping back costs a few "
        "ms instead of fusing again (default; memory: the weights its LoRA touches, 116 MB "
        "for a top-8 adapter of SmolLM2-135M)",
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

    if args.api_key is not None and not args.api_key.strip():
        raise ss.SpecstreamError("--api-key is empty: give a key, or leave the option out")
    extra = {}
    for item in args.adapter:
        name, sep, folder = item.partition("=")
        if not sep or not name.strip() or not folder.strip():
            raise ss.SpecstreamError(f"--adapter wants NAME=FOLDER, got {item!r}")
        extra[name.strip()] = folder.strip()
    sock = bind(args.host, args.port)  # a taken port fails now, before the model loads
    try:
        loaded = ss.load(args.model, precision=args.precision)
        manager = AdapterManager(loaded, max_resident=args.max_resident, keep_fused=args.keep_fused)
        for name, folder in extra.items():
            if name == loaded.name:
                raise ss.SpecstreamError(
                    f"--adapter {name}=...: {name!r} is the base model's name; give the adapter "
                    "another"
                )
            if name in manager.names():
                print(f"specstream serve: {name!r} serves {folder}, not the shipped adapter of "
                      "that name", file=sys.stderr)  # fmt: skip
            manager.register(name, folder)
        measure_device(loaded)
    except BaseException:
        sock.close()
        raise
    limits = Limits(max_body_bytes=args.max_body, max_tokens=args.max_tokens)
    app = create_app(manager, api_key=args.api_key, limits=limits, hosts=allowed_hosts(args))
    if args.host.strip("[]") not in ("127.0.0.1", "localhost", "::1"):
        print(f"specstream serve: listening on {args.host}: reachable from other machines",
              file=sys.stderr)  # fmt: skip
    print(
        f"specstream serve: {loaded.name} with adapters {', '.join(manager.names()) or 'none'} "
        f"on http://{args.host}:{args.port}/v1",
        file=sys.stderr,
    )
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn shut down on Ctrl-C, then raises the signal it caught
        pass
    except (OSError, SystemExit) as exc:  # uvicorn exits when its start-up fails
        raise ss.SpecstreamError(f"cannot serve on {args.host}:{args.port}: {exc}") from None
    finally:
        sock.close()
        app.state.worker.stop(wait=30.0)  # a request still running stops at its next token
    return 0


def measure_device(loaded) -> None:
    """This device's latency curve for the model, measured now if none is cached: the first
    speculative request would wait for it otherwise (minutes on a slow CPU), and its client
    might give up first."""
    from specstream_mlx.calibration import latency_curve

    latency_curve(loaded)  # says on stderr that it measures


def allowed_hosts(args) -> frozenset[str]:
    """Host header names served without an API key: this machine's, the bound address, and
    --allowed-host's."""
    from .server import LOCAL_HOSTS

    return LOCAL_HOSTS | {args.host.strip("[]").lower(), *(h.lower() for h in args.allowed_host)}


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to host:port as uvicorn binds one (uvicorn listens on it), or one clear
    SpecstreamError."""
    from specstream_mlx import SpecstreamError

    host = host.strip("[]")
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise SpecstreamError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None
    return sock
