"""`specstream chat`: a conversation in the terminal, answers streamed as they are decided, the
adapter switchable mid-session (one base model stays loaded)."""

from __future__ import annotations

import signal
import sys
from dataclasses import dataclass, field

from .args import (
    add_model_args,
    add_sampling_args,
    add_tuning_args,
    positive_int,
    sampling_of,
    tuning_of,
)
from .text_input import checked_text, text_problem

HELP = "chat in the terminal (commands: /adapter NAME, /stats, /reset, /quit)"
COMMANDS = """commands:
  /adapter          list the adapters; /adapter NAME switches (none: the base model alone)
  /stats            this session's totals
  /reset            forget the conversation
  /quit             leave (Ctrl-D too); Ctrl-C stops an answer"""


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("chat", help=HELP, description=HELP)
    add_model_args(p)
    p.add_argument(
        "--adapter",
        default=None,
        help="adapter to start with: shipped name or folder (default: chat where one ships "
        "for the model)",
    )
    p.add_argument(
        "--decoder",
        choices=["ar", "ss", "ss+pld", "pld"],
        default="ss+pld",
        help="default ss+pld (lossless, greedy or sampled); without an adapter the base model "
        "decodes plainly",
    )
    add_sampling_args(p)
    add_tuning_args(p)
    p.add_argument("--max-tokens", type=positive_int, default=512, help="per answer (512)")
    p.add_argument("--system", default=None, help="a system message that opens the conversation")
    p.set_defaults(run=run)


@dataclass
class Session:
    adapter: str | None
    decoder: str
    system: str | None
    sampling: object = None  # SamplingParams (None: greedy)
    messages: list[dict] = field(default_factory=list)
    answers: int = 0
    tokens: int = 0
    passes: int = 0
    accepted: int = 0
    seconds: float = 0.0
    tuning: dict = field(default_factory=dict)  # stream_generate's tree= and compile=

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []


def run(args) -> int:
    import specstream_mlx as ss
    from specstream_mlx.manager import AdapterManager

    # Ctrl-C stops an answer even when started from a parent that ignores SIGINT (a background
    # job of a non-interactive shell inherits SIG_IGN, and Python then keeps it).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if args.system is not None:
        checked_text(args.system, "--system")
    loaded = ss.load(args.model, precision=args.precision)
    manager = AdapterManager(loaded)
    adapter = args.adapter
    if adapter is not None and adapter not in manager.names():
        manager.register(adapter, adapter)  # a folder: checked against the base now
    if adapter is None and "chat" in manager.names():
        adapter = "chat"
    session = Session(adapter, args.decoder, args.system, sampling_of(args))
    session.tuning = tuning_of(args)
    session.reset()
    tty = sys.stdin.isatty()
    if hasattr(sys.stdin, "reconfigure"):  # an undecodable byte: a lone surrogate, not an error
        sys.stdin.reconfigure(errors="surrogateescape")
    print(
        f"specstream chat: {loaded.name}, adapter {adapter or 'none'}, decoder "
        f"{decoder_for(session)}. /help for commands, Ctrl-D to leave.",
        file=sys.stderr,
    )
    while True:
        try:
            line = input("> " if tty else "")
        except EOFError:
            if tty:
                print(file=sys.stderr)
            return 0
        except KeyboardInterrupt:  # at the prompt: a fresh line, the session goes on
            print(file=sys.stderr)
            continue
        except UnicodeDecodeError as exc:  # a stdin that cannot take errors=surrogateescape
            raise ss.SpecstreamError(f"stdin is not UTF-8 text ({exc.reason})") from None
        problem = text_problem(line)
        if problem:  # that line alone is refused: the conversation goes on
            print(f"(that line is {problem}: not sent)", file=sys.stderr)
            continue
        line = line.strip()
        if not line:
            continue
        if line.startswith("/"):
            if command(line, session, manager) == "quit":
                return 0
            continue
        answer(line, session, manager, args.max_tokens)


def decoder_for(session: Session) -> str:
    return session.decoder if session.adapter is not None else "ar"


def command(line: str, session: Session, manager) -> str | None:
    from specstream_mlx import SpecstreamError

    name, _, arg = line[1:].partition(" ")
    arg = arg.strip()
    if name in ("quit", "exit"):
        return "quit"
    if name == "reset":
        session.reset()
        print("(conversation forgotten)", file=sys.stderr)
    elif name == "stats":
        tau = session.accepted / session.passes if session.passes else 0.0
        speed = session.tokens / session.seconds if session.seconds else 0.0
        print(
            f"adapter {session.adapter or 'none'}, decoder {decoder_for(session)}; "
            f"{session.answers} answers, {session.tokens} tokens, {tau:.2f} tokens/pass, "
            f"{speed:.1f} tokens/s; {len(session.messages)} messages in the conversation",
            file=sys.stderr,
        )
    elif name == "adapter":
        if not arg:
            names = ", ".join(manager.names()) or "none registered"
            print(f"adapter {session.adapter or 'none'}; available: {names}", file=sys.stderr)
            return None
        target = None if arg == "none" else arg
        try:
            if target is not None and target not in manager.names():
                manager.register(target, target)  # a folder or another shipped name
        except SpecstreamError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return None
        session.adapter = target
        print(f"(adapter {arg})", file=sys.stderr)
    elif name == "help":
        print(COMMANDS, file=sys.stderr)
    else:
        print(f"unknown command /{name}\n{COMMANDS}", file=sys.stderr)
    return None


def fit_history(loaded, messages: list[dict], max_tokens: int) -> tuple[list[dict], int]:
    """The conversation with its oldest turns dropped (a system message stays) until the prompt
    leaves room for an answer of `max_tokens` (at least a quarter of the context); and how many
    messages were dropped. The latest user message always stays."""
    from specstream_mlx.chat_safety import encode_chat

    room = max(loaded.context_length - max_tokens, loaded.context_length * 3 // 4)
    head = messages[:1] if messages and messages[0]["role"] == "system" else []
    body = messages[len(head) :]
    dropped = 0
    while len(body) > 1 and len(encode_chat(loaded.tokenizer, head + body)) > room:
        body = body[2:] if len(body) > 2 and body[1]["role"] == "assistant" else body[1:]
        dropped = len(messages) - len(head) - len(body)
    return head + body, dropped


def answer(text: str, session: Session, manager, max_tokens: int) -> None:
    import specstream_mlx as ss
    from specstream_mlx.chat_safety import encode_chat

    messages = [*session.messages, {"role": "user", "content": text}]
    messages, dropped = fit_history(manager.loaded, messages, max_tokens)
    prompt = encode_chat(manager.loaded.tokenizer, messages)  # control tokens typed stay text
    if dropped:
        print(f"(the {dropped} oldest messages left the conversation: context full)",
              file=sys.stderr)  # fmt: skip
    pieces, stats, stopped = [], None, False
    try:
        with manager.use(session.adapter) as loaded:
            chunks = ss.stream_generate(
                loaded,
                prompt,
                max_tokens=max_tokens,
                decoder=decoder_for(session),
                sampling=session.sampling,
                **session.tuning,
            )
            try:
                for chunk in chunks:
                    sys.stdout.write(chunk.text)
                    sys.stdout.flush()
                    pieces.append(chunk.text)
                    stats = chunk.stats
            finally:
                chunks.close()
    except KeyboardInterrupt:  # while answering or while the adapter was put on
        stopped = True
    except ss.SpecstreamError as exc:
        hint = " (/reset starts a new conversation)" if "context" in str(exc) else ""
        print(f"error: {exc}{hint}", file=sys.stderr)
        return
    sys.stdout.write("\n")
    sys.stdout.flush()
    # The answer so far stays in the conversation, even when stopped.
    session.messages = [*messages, {"role": "assistant", "content": "".join(pieces)}]
    if stats is None:
        print("(stopped)" if stopped else "(no answer)", file=sys.stderr)
        return
    session.answers += 1
    session.tokens += stats.generated_tokens
    session.passes += stats.forward_passes
    session.accepted += stats.accepted_tokens
    session.seconds += stats.wall_seconds
    s = stats.to_dict()
    print(
        ("(stopped) " if stopped else "")
        + f"[{s['generated_tokens']} tokens, {s['mean_accepted_tokens']} tokens/pass, "
        f"{s['tokens_per_second']} tokens/s]",
        file=sys.stderr,
    )
