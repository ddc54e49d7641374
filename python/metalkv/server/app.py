"""The OpenAI-compatible HTTP app: routes, authentication, replies whole or streamed.

Starlette, not FastAPI: the checks of a body are protocol.py's, written to answer
with OpenAI's error objects and to name the field, so pydantic models would be a
second, disagreeing owner of them; Starlette's routing, requests and streaming
responses are all this needs, and uvicorn (its ASGI server) gives graceful
shutdown on SIGINT/SIGTERM.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..errors import ArgumentError, argument_error
from ..tool_formats import NativeFormat
from ..tools import ReplyStream
from . import protocol as proto
from .bridge import Bridge, Overloaded, Run
from .metrics import Metrics
from .store_worker import StoreWorker

MAX_BODY_BYTES = 32 << 20
DISCONNECT_CHECK_SECONDS = 0.5  # how often a request answered whole looks for a client that has gone
DEFAULT_MAX_CALLS = 256  # replies in flight (running or queued in the engine) before a request gets 429


class Server:
    """What the app's handlers share: the engine, its bridge and the server's defaults."""

    def __init__(self, engine, *, model_name: str, api_key: str | None = None, max_calls: int | None = None,
                 defaults: dict | None = None, max_tokens: int | None = None, prefix_store=None):
        self.engine = engine
        self.store = StoreWorker(prefix_store) if prefix_store is not None else None  # host/disk prefix tiers
        self.model_name = model_name
        self.api_key = api_key
        self.defaults = dict(defaults or {})  # Sampling fields a request leaves out
        self.max_tokens = max_tokens          # None: what the context has room for
        if max_calls is None:
            max_calls = DEFAULT_MAX_CALLS
        if not isinstance(max_calls, int) or isinstance(max_calls, bool) or max_calls < 1:
            raise argument_error("serve", "max_calls", max_calls, "an int >= 1 (replies in flight before a 429)")
        self.metrics = Metrics(engine, prefix_store)
        self.bridge = Bridge(engine, max_calls, on_end=self.ended)
        self.created = int(time.time())
        self.tool_format = NativeFormat.of_template(engine.chat_template)  # None: the generic tool format

    # ---- requests -----------------------------------------------------------------------
    def check_auth(self, request: Request) -> None:
        if self.api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
            raise proto.ApiError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'",
                                 code="invalid_api_key")

    async def body(self, request: Request) -> object:
        self.check_auth(request)
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > MAX_BODY_BYTES:
            raise proto.ApiError(413, f"the body is over {MAX_BODY_BYTES >> 20} MiB")
        raw = await request.body()
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise proto.bad("", f"the body is not valid JSON ({e})") from None  # param: none, the body itself

    def specs(self, job: proto.Job) -> list[dict]:
        """Engine.start's arguments for each choice: prompt p's choice j at p * n + j."""
        specs = []
        for ids in job.prompts:  # (whether the prompt fits is the engine's check: start())
            room = self.engine.context - len(ids)
            max_tokens = job.max_tokens or self.max_tokens or max(room, 1)
            for j in range(job.n):
                sampling = dict(self.defaults, **job.sampling, max_tokens=max_tokens)
                if sampling.get("seed") is not None:  # choices differ, each reproducible
                    sampling["seed"] = (sampling["seed"] + j) % 2**64
                specs.append(dict(prompt=ids, stop=job.stop, logprobs=job.logprobs, **sampling))
        return specs

    def ended(self, call) -> None:
        """A call's end: counted, and its prompt's cached blocks saved to the store's tiers."""
        stats = call.stats()
        self.metrics.ended(stats)
        if self.store is not None and stats["finish_reason"] != "aborted":
            self.store.save(getattr(call, "prompt_ids", None))

    def start(self, job: proto.Job) -> Run:
        try:
            specs = self.specs(job)
            run = self.bridge.start(specs)
            for call, spec in zip(run.calls, specs):
                call.prompt_ids = spec["prompt"]  # (what ended() saves)
            return run
        except Overloaded:
            raise proto.ApiError(429, f"the server is busy: {self.bridge.max_calls} replies are in flight; retry "
                                      f"shortly", type="rate_limit_error", code="server_busy",
                                 headers={"Retry-After": "1"}) from None
        except ArgumentError as e:  # the engine's own checks (sampling values, the prompt's room)
            if e.argument == "prompt":
                longest = max(len(ids) for ids in job.prompts)
                raise proto.bad("messages" if job.kind == "chat" else "prompt",
                                f"this model's context holds {self.engine.context} tokens, but the prompt has "
                                f"{longest}; shorten it (the server's --context sets the limit)",
                                code="context_length_exceeded") from None
            raise proto.bad(e.argument, str(e)) from None

    def token_text(self, token: int) -> str:
        return self.engine.tokenizer.decode([token])

    # ---- replies ------------------------------------------------------------------------
    def _logprobs(self, job: proto.Job, run: Run, i: int, start: int, offset: int = 0) -> dict | None:
        call = run.calls[i]
        if call.logprobs is None:
            return None
        entries = list(zip(call.ids[start:], call.logprobs[start:]))
        if job.kind == "chat":
            return proto.chat_logprobs(entries, self.token_text)
        return proto.completion_logprobs(entries, self.token_text, offset)

    def usage(self, job: proto.Job, run: Run) -> dict:
        firsts = [run.calls[p * job.n].stats() for p in range(len(job.prompts))]
        return proto.usage(sum(len(ids) for ids in job.prompts), sum(len(c.ids) for c in run.calls),
                           sum(int(st["prompt_tokens_cached"]) for st in firsts))

    @staticmethod
    def check_ended(run: Run, i: int) -> str:
        """Call i's finish reason in OpenAI's words; an error of the engine's as a 500."""
        call = run.calls[i]
        try:
            if run.errors[i] is not None:
                raise run.errors[i]
            call.request.result()
        except Exception as e:  # noqa: BLE001 - the engine failed this call: the client is told, the server goes on
            raise proto.ApiError(500, f"the engine failed this reply: {e}", type="server_error") from None
        reason = call.stats()["finish_reason"]
        if reason in ("cancelled", "aborted"):
            raise proto.ApiError(503, "the server is shutting down: the reply was cut short", type="server_error")
        return proto.finish_reason(reason)

    async def whole(self, request: Request, job: proto.Job, run: Run) -> Response:
        texts = [[] for _ in run.calls]
        watch = _ClientWatch(request)
        try:
            while not all(run.reported):
                progress = await watch.next(self.bridge.wait(run))
                if progress is None:  # the client has gone
                    return Response(status_code=499)
                for i, text, _ in progress:
                    texts[i].append(text)
        finally:
            if not run.done:
                run.cancel()
        choices = []
        for i in range(len(run.calls)):
            reason = self.check_ended(run, i)
            text = "".join(texts[i])
            if job.kind == "chat":
                choice = {"index": i, "message": {"role": "assistant", "content": text}}
                if job.tools is not None:
                    content, calls = job.tools.reply(text)
                    choice["message"]["content"] = content
                    if calls:
                        choice["message"]["tool_calls"] = calls
                        reason = "tool_calls" if reason == "stop" else reason
            else:
                echo = job.prompt_texts[i // job.n] if job.echo else ""
                choice = {"index": i, "text": echo + text}
            choice["logprobs"] = self._logprobs(job, run, i, 0)
            choice["finish_reason"] = reason
            choices.append(choice)
        return JSONResponse(dict(proto.envelope(job, chunk=False), choices=choices, usage=self.usage(job, run)))

    async def events(self, job: proto.Job, run: Run):
        """Server-sent events: a chunk per piece of text, each choice's end, usage if asked,
        then [DONE]. If the client goes away, the generator is closed: its calls are cancelled."""
        def event(choices: list, **extra) -> str:
            chunk = dict(proto.envelope(job, chunk=True), choices=choices, **extra)
            if job.include_usage and "usage" not in chunk:
                chunk["usage"] = None
            return f"data: {json.dumps(chunk, separators=(',', ':'), ensure_ascii=False)}\n\n"

        chat = job.kind == "chat"
        held = [ReplyStream(job.tools) for _ in run.calls] if job.tools is not None else None  # tools: parsed
        sent = [0] * len(run.calls)    # ids whose logprobs went out
        offset = [0] * len(run.calls)  # text sent (completions' text_offset)
        try:
            for i in range(len(run.calls)):
                if chat:
                    yield event([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                  "finish_reason": None}])
                elif job.echo:
                    text = job.prompt_texts[i // job.n]
                    offset[i] = len(text)
                    yield event([{"index": i, "text": text, "logprobs": None, "finish_reason": None}])
            while not all(run.reported):
                for i, text, finished in await self.bridge.wait(run):
                    call = run.calls[i]
                    fresh = len(call.ids) > sent[i]  # ids whose logprobs have not gone out yet
                    logprobs = self._logprobs(job, run, i, sent[i], offset[i]) if fresh else None
                    sent[i] = len(call.ids)
                    if held is not None:
                        for delta in held[i].feed(text):
                            yield event([{"index": i, "delta": delta, "logprobs": None, "finish_reason": None}])
                    elif text or logprobs:
                        body = {"delta": {"content": text}} if chat else {"text": text}
                        yield event([dict({"index": i}, **body, logprobs=logprobs, finish_reason=None)])
                        offset[i] += len(text)
                    if finished:
                        try:
                            reason = self.check_ended(run, i)
                        except proto.ApiError as e:
                            yield f"data: {json.dumps(e.body())}\n\n"
                            continue
                        body = {"delta": {}} if chat else {"text": ""}
                        if held is not None:  # what the reply holds back to its end (ReplyStream)
                            for delta in held[i].finish():
                                yield event([{"index": i, "delta": delta, "logprobs": None, "finish_reason": None}])
                            reason = "tool_calls" if held[i].called and reason == "stop" else reason
                        yield event([dict({"index": i}, **body, logprobs=None, finish_reason=reason)])
            if job.include_usage:
                yield event([], usage=self.usage(job, run))
            yield "data: [DONE]\n\n"
        finally:
            if not run.done:
                run.cancel()


class QuietCancel:
    """The shutdown's backstop: a reply still running CUT_SHORT_SECONDS after the grace
    (listen.py; the server has cut it short already, so only an engine that did not stop)
    is cancelled by uvicorn, its calls on the way out (Server.events' finally). That is
    the shutdown working, not an error of the app: no traceback."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        try:
            await self.app(scope, receive, send)
        except asyncio.CancelledError:
            if scope["type"] != "http":
                raise


class _EventStream(StreamingResponse):
    """A streaming response that closes its generator when it ends, however it ends: when
    the client has gone, Starlette stops at the failed send and leaves the generator to the
    garbage collector, whose timing (a reference cycle through the exception) would decide
    when the reply's call is cancelled."""

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


class _ClientWatch:
    """Looks for a client that has gone every DISCONNECT_CHECK_SECONDS while a whole reply
    is made, however often the reply makes progress (a stream's client is seen by its send)."""

    def __init__(self, request: Request):
        self.request = request
        self.check_at = asyncio.get_running_loop().time() + DISCONNECT_CHECK_SECONDS

    async def next(self, progress):
        """What the awaitable `progress` gives, or None once the client has disconnected."""
        loop = asyncio.get_running_loop()
        waiter = asyncio.ensure_future(progress)
        try:
            while True:
                done, _ = await asyncio.wait({waiter}, timeout=max(0.0, self.check_at - loop.time()))
                if loop.time() >= self.check_at:
                    self.check_at = loop.time() + DISCONNECT_CHECK_SECONDS
                    if await self.request.is_disconnected():
                        return None
                if done:
                    return waiter.result()
        finally:
            if not waiter.done():
                waiter.cancel()


def create_app(engine, **options) -> Starlette:
    """The app for `engine` (Server's options: model_name, api_key, max_calls, defaults, max_tokens,
    prefix_store: a metalkv.prefix_store.PrefixStore of the engine, or None)."""
    server = Server(engine, **options)

    async def respond(request: Request, parse) -> Response:
        job = parse(await server.body(request))
        if server.store is not None:  # the prompts' blocks the host or disk tier holds go back to the pool
            for ids in job.prompts:
                await asyncio.to_thread(server.store.warm, ids)
        run = server.start(job)
        if job.stream:
            return _EventStream(server.events(job, run), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await server.whole(request, job, run)

    async def chat_completions(request: Request) -> Response:
        return await respond(request, lambda body: proto.parse_chat(body, server.model_name, engine.chat_ids,
                                                                    server.tool_format, engine.tokenizer))

    async def completions(request: Request) -> Response:
        tokenizer = engine.tokenizer
        return await respond(request, lambda body: proto.parse_completion(
            body, server.model_name, lambda text: tokenizer.encode(text), engine.config.vocab))

    def model_entry() -> dict:
        return {"id": server.model_name, "object": "model", "created": server.created, "owned_by": "metalkv"}

    async def models(request: Request) -> Response:
        server.check_auth(request)
        return JSONResponse({"object": "list", "data": [model_entry()]})

    async def model(request: Request) -> Response:
        server.check_auth(request)
        if request.path_params["model"] != server.model_name:
            raise proto.ApiError(404, f"The model '{request.path_params['model']}' does not exist",
                                 param="model", code="model_not_found")
        return JSONResponse(model_entry())

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": server.model_name,
                             "calls_in_flight": server.bridge.calls_in_flight,
                             "calls_cancelled": server.bridge.cancelled, "max_batch": server.bridge.max_batch})

    async def metrics(request: Request) -> Response:
        server.check_auth(request)
        body, content_type = server.metrics.text()
        return Response(body, media_type=content_type)

    async def api_error(request: Request, e: proto.ApiError) -> Response:
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    async def http_error(request: Request, e: HTTPException) -> Response:  # unknown routes, wrong methods
        return JSONResponse(proto.ApiError(e.status_code, f"{request.method} {request.url.path}: {e.detail}").body(),
                            status_code=e.status_code, headers=getattr(e, "headers", None))

    async def internal_error(request: Request, e: Exception) -> Response:
        return JSONResponse(proto.ApiError(500, f"internal error: {type(e).__name__}: {e}",
                                           type="server_error").body(), status_code=500)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        server.bridge.open()
        try:
            yield
        finally:
            await server.bridge.close()
            if server.store is not None:
                server.store.close()

    app = Starlette(routes=[
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ], exception_handlers={proto.ApiError: api_error, HTTPException: http_error, Exception: internal_error},
        middleware=[Middleware(QuietCancel)], lifespan=lifespan)
    app.state.server = server
    return app
