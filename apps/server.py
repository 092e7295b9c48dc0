"""The OpenAI-compatible local server behind `specstream serve` (FastAPI + uvicorn).

One base model stays loaded; each request may name an adapter (`"adapter"` in the body, or an
adapter's name as `"model"`) and the AdapterManager puts it on for that request only. Requests
queue for one worker thread that owns the model, so generations never interleave; a client that
disconnects (or a stream that is dropped) cancels its generation at the next decided token (or
the next chunk of its prompt's prefill) and frees the worker. Errors are OpenAI-shaped:
{"error": {"message", "type", "param", "code"}}.

Besides OpenAI's fields a response carries "speculative": the decoder, forward passes, tokens per
pass (tau) and decoding speed. Greedy (temperature 0) is the default; every decoder is lossless
greedy or sampled (temperature > 0: tree rejection sampling, the tokens are distributed exactly as
plain sampling's).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import queue
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Annotated, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import ClientDisconnect

import specstream_mlx as ss
from specstream_mlx.chat_safety import encode_chat
from specstream_mlx.generate import encode_prompt
from specstream_mlx.manager import AdapterManager

from .text_input import text_problem

DECODERS = ("ar", "ss", "pld", "ss+pld")
# Host headers always accepted without an API key (a web page cannot reach the server through
# a name of its own, which DNS rebinding would point here); serve adds the bound address and
# --allowed-host names.
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 1_000_000
    max_tokens: int = 2048  # per request
    max_queue: int = 256  # requests waiting or running; more get 503


def _valid_text(text: str) -> str:
    problem = text_problem(text)
    if problem:  # a JSON escape like "\ud800": no tokenizer takes it
        raise ValueError(problem)
    return text


Text = Annotated[str, AfterValidator(_valid_text)]
# Strict: JSON types are not coerced ("5" is not an integer, "yes" not a boolean).
STRICT = ConfigDict(extra="ignore", strict=True)  # OpenAI fields we do not use are accepted


class TextPart(BaseModel):
    model_config = STRICT
    type: Literal["text"]
    text: Text


class Message(BaseModel):
    model_config = STRICT
    role: Literal["system", "developer", "user", "assistant"]
    content: Text | list[TextPart]

    def plain(self) -> dict:
        """{"role", "content"} for the chat template: parts joined, developer = system."""
        content = self.content
        if not isinstance(content, str):
            content = "".join(part.text for part in content)
        return {"role": "system" if self.role == "developer" else self.role, "content": content}


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False  # usage rides on the last chunk either way


class _Common(BaseModel):
    model_config = STRICT
    model: str | None = None
    adapter: str | None = None
    decoder: Literal["ar", "ss", "pld", "ss+pld"] | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)  # OpenAI's newer name
    temperature: float = Field(default=0.0, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=1)
    stop: str | list[str] | None = None  # refused when given: not supported yet
    # OpenAI fields that would change the answer and are not supported: refused when they ask
    # for something (make_job), not silently ignored
    logprobs: object = None
    top_logprobs: object = None
    echo: object = None
    suffix: object = None
    best_of: object = None
    logit_bias: object = None
    presence_penalty: object = None
    frequency_penalty: object = None
    response_format: object = None
    tools: object = None
    functions: object = None


# the fields above typed `object`: named once, there
UNSUPPORTED = tuple(name for name, f in _Common.model_fields.items() if f.annotation is object)


def _asks(name: str, value) -> bool:
    """Whether an unsupported field's value asks for something (its defaults do not)."""
    if name == "response_format" and value == {"type": "text"}:
        return False
    if name == "best_of" and value == 1:
        return False
    return value not in (None, False, 0, "", [], {})


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)


class CompletionRequest(_Common):
    prompt: Text = Field(min_length=1)


class ApiError(Exception):
    def __init__(
        self, status: int, message: str, kind: str, param: str | None = None, code: str = ""
    ):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param
        self.code = code or CODES.get(status)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code}}  # fmt: skip

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


# OpenAI's error codes are strings (or null); the HTTP status says the class.
CODES = {
    400: "invalid_request",
    401: "invalid_api_key",
    403: "host_not_allowed",
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
    415: "unsupported_media_type",
    422: "invalid_value",
    500: "internal_error",
    503: "server_busy",
}


def error_response(status: int, message: str, kind: str, param: str | None = None):
    return ApiError(status, message, kind, param).response()


@dataclass
class Job:
    """One generation for the worker; chunks come back through `out` (None ends it)."""

    adapter: str | None
    prompt: list[int]  # token ids, chat template applied
    max_tokens: int
    sampling: ss.SamplingParams
    decoder: str
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def send(self, item) -> None:
        """Hand `item` to the request's event loop; a loop that is gone (server shutting down)
        means nobody listens any more: the generation stops."""
        try:
            self.loop.call_soon_threadsafe(self.out.put_nowait, item)
        except RuntimeError:  # the loop is closed
            self.cancelled.set()


class Worker:
    """The one thread that runs generations, in arrival order."""

    def __init__(self, manager: AdapterManager, limits: Limits):
        self.manager, self.limits = manager, limits
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.pending = 0  # queued or running
        self.running = False
        self.cancelled = 0  # generations stopped early because their client left
        self.tokens = 0  # decided so far by the running (or the last) generation
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name="specstream-worker", daemon=True)
        self.thread.start()

    def submit(self, job: Job) -> None:
        with self._lock:
            if self.pending >= self.limits.max_queue:
                raise ApiError(503, "the server is busy: too many queued requests", "server_busy")
            self.pending += 1
        self.jobs.put(job)

    def stop(self, wait: float = 0.0) -> None:
        """No more jobs after those queued; `wait` seconds for the thread to end (an MLX thread
        still alive when the interpreter exits can abort it: the server's Ctrl-C)."""
        self.jobs.put(None)
        if wait:
            self.thread.join(wait)

    def _run(self) -> None:
        import mlx.core as mx

        try:
            self._serve_jobs()
        finally:  # MLX's streams of this thread, destroyed before it ends: else the process
            mx.clear_streams()  # aborts at exit ("terminate called without an active exception")

    def _serve_jobs(self) -> None:
        while (job := self.jobs.get()) is not None:
            self.running = True
            try:
                if job.cancelled.is_set():
                    self.cancelled += 1
                else:
                    self._generate(job)
            except ss.SpecstreamError as exc:
                job.send(ApiError(422, str(exc), "invalid_request_error"))
            except Exception as exc:  # a bug: the request fails, the server goes on
                job.send(ApiError(500, f"internal error: {exc}", "server_error"))
            finally:
                job.send(None)
                self.running = False
                with self._lock:
                    self.pending -= 1

    def _generate(self, job: Job) -> None:
        with self.manager.use(job.adapter) as loaded:
            chunks = ss.stream_generate(
                loaded,
                job.prompt,
                max_tokens=job.max_tokens,
                sampling=job.sampling,
                decoder=job.decoder,
                stop=job.cancelled.is_set,  # a client gone during a long prompt's prefill
            )
            try:
                self.tokens = 0
                for chunk in chunks:
                    self.tokens = chunk.stats.generated_tokens
                    job.send(chunk)
                    if chunk.finish_reason == "cancelled" or (
                        job.cancelled.is_set() and chunk.finish_reason is None
                    ):  # left during the prefill, or after a token
                        self.cancelled += 1
                        break
            finally:
                chunks.close()


def create_app(
    manager: AdapterManager,
    api_key: str | None = None,
    limits: Limits | None = None,
    hosts: frozenset[str] | set[str] = LOCAL_HOSTS,
) -> FastAPI:
    """The app. Without an API key only requests whose Host header names one of `hosts` ("*":
    any) are served, so that a web page cannot drive the server through DNS rebinding; every
    POST wants Content-Type application/json, which a page cannot send to another origin without
    the browser asking first (no CORS is served)."""
    limits = limits or Limits()
    worker = Worker(manager, limits)
    app = FastAPI(title="specstream", docs_url=None, redoc_url=None)
    app.state.worker = worker
    base = manager.loaded.name
    hosts = frozenset(h.lower() for h in hosts)

    @app.exception_handler(404)
    async def not_found(request: Request, exc):
        return error_response(404, f"no route {request.url.path}", "not_found_error")

    @app.exception_handler(405)
    async def bad_method(request: Request, exc):
        return error_response(405, f"{request.method} not allowed here", "invalid_request_error")

    @app.exception_handler(Exception)
    async def internal(request: Request, exc):  # a bug: a JSON error all the same
        return error_response(500, f"internal error: {exc}", "server_error")

    def check(request: Request) -> None:
        """With --api-key every /v1 route wants `Authorization: Bearer KEY` (OpenAI clients send
        their api_key so); without one, the Host header must name this server. Checked in each
        route: a middleware would wrap the streams."""
        if api_key is None:
            check_host(request, hosts)
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            raise ApiError(401, "invalid or missing API key", "authentication_error")

    @app.get("/health")
    async def health(request: Request):
        if api_key is None:
            try:
                check_host(request, hosts)
            except ApiError as exc:
                return exc.response()
        return {
            "status": "ok",
            "pending": worker.pending,
            "running": worker.running,
            "cancelled": worker.cancelled,
            "tokens": worker.tokens,
        }

    @app.get("/v1/models")
    async def models(request: Request):
        try:
            check(request)
        except ApiError as exc:
            return exc.response()
        now = int(time.time())
        data = [{"id": base, "object": "model", "created": now, "owned_by": "specstream"}]
        for name in manager.names():
            data.append(
                {"id": name, "object": "model", "created": now, "owned_by": "specstream",
                 "parent": base, "adapter": name, "source": manager.source(name)}
            )  # fmt: skip
        return {"object": "list", "data": data}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        try:
            check(request)
            body = await read_body(request, ChatRequest, limits)
            messages = [m.plain() for m in body.messages]
            job = make_job(body, messages, True, manager, base, limits)
        except ApiError as exc:
            return exc.response()
        return await respond(request, job, body, "chat", worker)

    @app.post("/v1/completions")
    async def completions(request: Request):
        try:
            check(request)
            body = await read_body(request, CompletionRequest, limits)
            job = make_job(body, body.prompt, False, manager, base, limits)
        except ApiError as exc:
            return exc.response()
        return await respond(request, job, body, "text", worker)

    return app


def host_name(header: str) -> str:
    """The name in a Host header, without its port: "[::1]:8080" -> "::1"."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    name, _, port = header.rpartition(":")
    return name if name and port.isdigit() and ":" not in name else header


def check_host(request: Request, hosts: frozenset[str]) -> None:
    name = host_name(request.headers.get("host", "")).rstrip(".")
    if "*" not in hosts and name not in hosts:
        raise ApiError(
            403, f"Host {name!r} is not allowed without an API key (allowed: "
            f"{', '.join(sorted(hosts))}; serve --allowed-host NAME adds one)", "permission_error",
        )  # fmt: skip


async def read_body(request: Request, model: type[BaseModel], limits: Limits):
    """The JSON body, validated; read chunk by chunk and refused as soon as it passes the size
    limit (a chunked body declares no length)."""
    kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if kind != "application/json":
        raise ApiError(
            415, f"Content-Type must be application/json, got {kind or 'none'!r}",
            "invalid_request_error",
        )  # fmt: skip
    too_large = ApiError(
        413, f"request body over {limits.max_body_bytes} bytes", "invalid_request_error"
    )
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limits.max_body_bytes:
        raise too_large
    raw = bytearray()
    try:
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > limits.max_body_bytes:
                raise too_large
    except ClientDisconnect:  # nobody reads the answer; the server goes on
        raise ApiError(499, "the client left before sending its request", "client_closed") from None
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc}", "invalid_request_error") from None
    except RecursionError:
        raise ApiError(
            400, "the body is not valid JSON here: nested too deeply", "invalid_request_error"
        ) from None
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object", "invalid_request_error")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"] if not _branch(p))
        more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
        raise ApiError(
            422, f"{param}: {first['msg']}{more}", "invalid_request_error", param
        ) from None


def _branch(part) -> bool:
    """Whether a pydantic error location part names a branch of a union or a validator
    ("str", "list[TextPart]", "function-after[_valid_text(), str]"), not a field or index."""
    return isinstance(part, str) and (part in ("str", "int", "float", "bool") or "[" in part)


def make_job(body: _Common, prompt, chat: bool, manager, base: str, limits: Limits) -> Job:
    """The request's adapter, decoder and prompt tokens, every check that can be made before it
    queues done here (a streamed request cannot change its status once it has started)."""
    adapter = body.adapter
    if adapter is None and body.model not in (None, base, "default"):
        adapter = body.model  # an adapter's id from /v1/models
    if adapter is not None and adapter not in manager.names():
        known = ", ".join([base, *manager.names()])
        what = "adapter" if body.adapter is not None else "model"
        raise ApiError(
            404, f"unknown {what} {adapter!r}; available: {known}", "not_found_error", what,
            "model_not_found",
        )  # fmt: skip
    if body.stop:
        raise ApiError(422, "stop sequences are not supported yet", "invalid_request_error", "stop")
    for name in UNSUPPORTED:
        if _asks(name, getattr(body, name)):
            raise ApiError(422, f"{name} is not supported", "invalid_request_error", name)
    if body.adapter is not None and body.model not in (None, base, "default", body.adapter):
        raise ApiError(
            422, f"model {body.model!r} and adapter {body.adapter!r} disagree: give one",
            "invalid_request_error", "adapter",
        )  # fmt: skip
    max_tokens = body.max_tokens or body.max_completion_tokens or min(256, limits.max_tokens)
    if max_tokens > limits.max_tokens:
        raise ApiError(
            422, f"max_tokens: at most {limits.max_tokens} per request", "invalid_request_error",
            "max_tokens",
        )  # fmt: skip
    # Every decoder is lossless, greedy or sampled (tree rejection sampling).
    decoder = body.decoder or ("ss+pld" if adapter is not None else "ar")
    loaded = manager.loaded
    try:  # message content is text: a control token typed in it stays text
        ids = (
            encode_chat(loaded.tokenizer, prompt) if chat else encode_prompt(loaded, prompt, False)
        )
    except ss.SpecstreamError as exc:
        param = "messages" if chat else "prompt"
        raise ApiError(422, str(exc), "invalid_request_error", param) from None
    if len(ids) >= loaded.context_length:
        raise ApiError(
            400, f"the prompt has {len(ids)} tokens; the model's context holds "
            f"{loaded.context_length}", "invalid_request_error", "messages" if chat else "prompt",
            "context_length_exceeded",
        )  # fmt: skip
    sampling = ss.SamplingParams(body.temperature, body.top_p, 0, body.seed)
    return Job(adapter, ids, max_tokens, sampling, decoder, asyncio.get_running_loop())


async def respond(request: Request, job: Job, body: _Common, kind: str, worker: Worker):
    try:
        worker.submit(job)
    except ApiError as exc:
        return exc.response()
    ident = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
    model = job.adapter or body.model or worker.manager.loaded.name
    if body.stream:
        return StreamingResponse(
            stream_events(request, job, ident, model, kind), media_type="text/event-stream"
        )
    text, last = [], None
    watcher = asyncio.create_task(cancel_on_disconnect(request, job))
    try:
        while (item := await job.out.get()) is not None:
            if isinstance(item, ApiError):
                return item.response()
            text.append(item.text)
            last = item
    finally:
        watcher.cancel()
    return JSONResponse(final_object(ident, model, kind, job, "".join(text), last))


async def cancel_on_disconnect(request: Request, job: Job) -> None:
    """Cancel `job` when its client leaves: the body has been read, so the next message the
    server sends the app is the disconnect. The worker stops at the next decided token, or
    before the next chunk of the prompt's prefill."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    job.cancelled.set()


def final_object(ident, model, kind, job: Job, text: str, last) -> dict:
    finish = (last.finish_reason if last else None) or "length"
    if kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text}}
        obj = "chat.completion"
    else:
        choice, obj = {"index": 0, "text": text, "logprobs": None}, "text_completion"
    choice["finish_reason"] = finish
    return {
        "id": ident, "object": obj, "created": int(time.time()), "model": model,
        "choices": [choice], **usage(job, last),
    }  # fmt: skip


def usage(job: Job, last) -> dict:
    stats = last.stats if last else ss.GenerationStats()
    return {
        "usage": {
            "prompt_tokens": stats.prompt_tokens,
            "completion_tokens": stats.generated_tokens,
            "total_tokens": stats.prompt_tokens + stats.generated_tokens,
        },
        "speculative": {
            "decoder": stats.decoder or job.decoder,  # what ran (ss+pld may run as pld)
            "requested_decoder": job.decoder,
            "adapter": job.adapter,
            "forward_passes": stats.forward_passes,
            "mean_accepted_tokens": round(stats.mean_accepted_tokens, 4),
            "tokens_per_second": round(stats.tokens_per_second, 3),
        },
    }


async def stream_events(
    request: Request, job: Job, ident: str, model: str, kind: str
) -> AsyncIterator[str]:
    """Server-sent events: chunks as tokens are decided, a last chunk with the finish reason and
    usage, then [DONE]. Dropped by the client: the generation is cancelled."""
    created = int(time.time())
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"

    def event(payload: dict) -> str:
        return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def chunk(delta_or_text, finish=None) -> dict:
        if kind == "chat":
            choice = {"index": 0, "delta": delta_or_text, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": delta_or_text, "logprobs": None, "finish_reason": finish}
        return {"id": ident, "object": obj, "created": created, "model": model, "choices": [choice]}

    last = None
    try:
        if kind == "chat":
            yield event(chunk({"role": "assistant", "content": ""}))
        while (item := await job.out.get()) is not None:
            if isinstance(item, ApiError):
                yield event(
                    {"error": {"message": item.message, "type": item.kind, "code": item.code}}
                )
                break
            last = item
            if item.text:
                yield event(chunk({"content": item.text} if kind == "chat" else item.text))
        else:
            finish = (last.finish_reason if last else None) or "length"
            yield event({**chunk({} if kind == "chat" else "", finish), **usage(job, last)})
            yield "data: [DONE]\n\n"
    finally:
        job.cancelled.set()  # no-op when finished; frees the worker when the client left
