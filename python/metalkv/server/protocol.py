"""OpenAI's wire format: request bodies checked into Jobs, Jobs' results into responses.

Every field's type is checked here, each failure an ApiError that the app answers
with OpenAI's error object ({"error": {"message", "type", "param", "code"}}), naming
the field; the sampling values' ranges are the engine's own checks (an ArgumentError
naming the argument, answered the same way). A field OpenAI does not define (nor the
vLLM sampling extensions taken here) is refused with OpenAI's own words, so a typo
(`max_token`) is not silently a default; fields the server cannot honour (suffix, the
legacy function fields, ...) are refused by name rather than dropped, and
the rest OpenAI defines that change nothing here (user, metadata, store, ...) are taken.
A message's image and audio parts go to the engine, which refuses them for a model that
cannot read them (a text model: 400, naming the part); a path to a file of the server's is
refused here (docs/MULTIMODAL.md "Server").
"""
from __future__ import annotations

import math
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

MAX_N = 16           # choices per request
MAX_STOPS = 16       # stop strings per request (OpenAI takes 4)
MAX_LOGPROBS = 20    # alternatives per token (OpenAI's top_logprobs limit)


class ApiError(Exception):
    """An HTTP error answered with OpenAI's error object."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


# The request fields OpenAI defines (its API reference; openai-python's *CreateParams,
# which tests/server/test_unknown_fields.py compares with these), and the vLLM sampling
# extensions metalkv implements. Anything else in a body is refused (unknown_fields).
CHAT_FIELDS = frozenset((
    "messages", "model", "audio", "frequency_penalty", "function_call", "functions", "logit_bias", "logprobs",
    "max_completion_tokens", "max_tokens", "metadata", "modalities", "moderation", "n", "parallel_tool_calls",
    "prediction", "presence_penalty", "prompt_cache_key", "prompt_cache_options", "prompt_cache_retention",
    "reasoning_effort", "response_format", "safety_identifier", "seed", "service_tier", "stop", "store", "stream",
    "stream_options", "temperature", "tool_choice", "tools", "top_logprobs", "top_p", "user", "verbosity",
    "web_search_options"))
COMPLETION_FIELDS = frozenset((
    "prompt", "model", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
    "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix", "temperature", "top_p", "user"))
EXTENSIONS = frozenset(("top_k", "min_p", "repetition_penalty"))  # vLLM's names, taken by both endpoints


def bad(param: str, message: str, code: str | None = None) -> ApiError:
    """400 for a field (param) of the body, or for the body itself (param ''). The message
    says the field first, once: a check's own "[op] " tag is dropped, and a message that
    already starts with the field (the engine's "top_p=0.0: ...", the chat checks'
    "messages[0].role: ...") is not prefixed again."""
    message = re.sub(r"^\[\w+\] ", "", message)
    named = param and message.startswith(param) and message[len(param):len(param) + 1] in ("", ":", "[", ".", "=")
    return ApiError(400, f"{param}: {message}" if param and not named else message, param=param or None, code=code)


def unknown_fields(body: dict, known: frozenset) -> None:
    """OpenAI's 400 for fields it does not define, in its words (param null, as its own)."""
    unknown = sorted(k for k in body if k not in known and k not in EXTENSIONS)
    if unknown:
        s = "s" if len(unknown) > 1 else ""
        raise ApiError(400, f"Unrecognized request argument{s} supplied: {', '.join(unknown)}")


# ---- field checks ------------------------------------------------------------------------
def _number(body: dict, name: str, lo: float | None = None, hi: float | None = None) -> float | None:
    """A JSON number (or null). Ranges are the engine's to check (Sampling.check, one owner),
    but for limits OpenAI sets and the engine does not (temperature <= 2)."""
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise bad(name, f"expected a number, got {v!r}")
    if lo is not None and not lo <= v <= hi:
        raise bad(name, f"{v!r} is out of range: expected a number in [{lo}, {hi}]")
    return float(v)


def _int(body: dict, name: str, lo: int, hi: int | None = None) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad(name, f"expected an integer, got {v!r}")
    if v < lo or (hi is not None and v > hi):
        raise bad(name, f"{v!r} is out of range: expected an integer >= {lo}" + (f" and <= {hi}" if hi else ""))
    return v


def _bool(body: dict, name: str) -> bool | None:
    v = body.get(name)
    if v is not None and not isinstance(v, bool):
        raise bad(name, f"expected true or false, got {v!r}")
    return v


def _refuse_set(body: dict, names: tuple[str, ...], why: str) -> None:
    for name in names:
        if body.get(name) not in (None, [], {}, False):
            raise bad(name, f"not supported: {why}")


def _stops(body: dict) -> list[str]:
    v = body.get("stop")
    if v is None:
        return []
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad("stop", f"expected a string or a list of strings, got {v!r}")
    if len(stops) > MAX_STOPS:
        raise bad("stop", f"at most {MAX_STOPS} stop strings, got {len(stops)}")
    return [s for s in stops if s]  # an empty stop string would end every reply at once: OpenAI ignores it


@dataclass
class Job:
    """One request, checked: prompts (token ids), each answered `n` times."""
    kind: str                         # "chat" | "completion"
    model: str
    prompts: list[list[int]]
    n: int = 1
    sampling: dict = field(default_factory=dict)   # metalkv.Sampling fields the request set
    max_tokens: int | None = None     # None: the server's default
    stop: list[str] = field(default_factory=list)
    logprobs: int | None = None       # alternatives per token; None: no logprobs
    stream: bool = False
    include_usage: bool = False
    echo: bool = False                # completions: the prompt's text before each reply
    prompt_texts: list[str] = field(default_factory=list)  # with echo
    tools: Any = None                 # chat: metalkv.tools.Tools, the reply held to its schema and parsed back
    id: str = ""
    created: int = 0

    def __post_init__(self):
        self.id = self.id or ("chatcmpl-" if self.kind == "chat" else "cmpl-") + uuid.uuid4().hex
        self.created = self.created or int(time.time())


def _common(body: Any, kind: str, served: str) -> Job:
    """The fields chat and completions share."""
    if not isinstance(body, dict):
        raise bad("", f"the request body must be a JSON object, got {type(body).__name__}")
    unknown_fields(body, CHAT_FIELDS if kind == "chat" else COMPLETION_FIELDS)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad("model", f"expected a string, got {model!r}")
    if model not in (None, "", served):
        raise ApiError(404, f"The model '{model}' does not exist; this server serves '{served}' (GET /v1/models)",
                       param="model", code="model_not_found")
    job = Job(kind, served, [])
    sampling = {name: _number(body, name) for name in ("top_p", "min_p", "repetition_penalty", "presence_penalty",
                                                        "frequency_penalty")}
    sampling["temperature"] = _number(body, "temperature", 0.0, 2.0)
    sampling["seed"] = _int(body, "seed", -2**63, 2**64 - 1)
    top_k = _int(body, "top_k", -1)
    sampling["top_k"] = None if top_k is None else max(top_k, 0)  # vLLM's -1 = off, as our 0
    if sampling["seed"] is not None:
        sampling["seed"] %= 2**64  # the engine draws from a 64-bit seed; negative seeds are seeds too
    job.sampling = {k: v for k, v in sampling.items() if v is not None}
    job.max_tokens = _int(body, "max_completion_tokens", 1) if kind == "chat" else None
    if job.max_tokens is None:
        job.max_tokens = _int(body, "max_tokens", 1)
    job.n = _int(body, "n", 1, MAX_N) or 1
    job.stop = _stops(body)
    job.stream = bool(_bool(body, "stream"))
    options = body.get("stream_options")
    if options is not None:
        if not job.stream:
            raise bad("stream_options", "only allowed with stream: true")
        if not isinstance(options, dict):
            raise bad("stream_options", f"expected an object, got {options!r}")
        job.include_usage = bool(_bool(options, "include_usage"))
    if body.get("best_of") not in (None, 1):
        raise bad("best_of", "not supported (only 1); use n for several choices")
    bias = _logit_bias(body)
    if bias:
        job.sampling["logit_bias"] = bias
    _refuse_set(body, ("functions", "function_call"), "the legacy function fields: use tools and tool_choice")
    fmt = body.get("response_format")
    if fmt is not None:
        if kind != "chat":
            raise bad("response_format", "not a field of /v1/completions")
        if not isinstance(fmt, dict):
            raise bad("response_format", f"expected an object, got {fmt!r}")
        if fmt.get("type") != "text":  # json_object, json_schema: the engine compiles and checks it
            job.sampling["response_format"] = fmt
    return job


def _logit_bias(body: dict) -> dict[int, float] | None:
    """OpenAI's logit_bias: {"token id" (a JSON key, so a string): bias}; ids and
    ranges are the engine's to check."""
    v = body.get("logit_bias")
    if v is None:
        return None
    if not isinstance(v, dict):
        raise bad("logit_bias", f"expected an object mapping token ids to biases, got {v!r}")
    out = {}
    for k, b in v.items():
        if not re.fullmatch(r"-?[0-9]+", str(k)):
            raise bad("logit_bias", f"{k!r} is not a token id")
        if isinstance(b, bool) or not isinstance(b, (int, float)):
            raise bad("logit_bias", f"the bias of {k} is {b!r}: expected a number")
        out[int(k)] = float(b)
    return out


def _no_server_files(messages: Any) -> None:
    """A request's images and clips come with it (a data URL, input_audio) or from an http(s)
    URL (fetched only where the server allows it): a path, or a file:// URL, names a file of the
    server's machine, which no request may read."""
    from ..errors import ArgumentError
    from ..messages import media_parts

    try:
        parts = media_parts(messages, tool_turns=True)
    except ArgumentError:
        return  # chat_ids says what is wrong, in the model's terms
    for p in parts:
        if isinstance(p.source, str) and p.source[:5].lower() != "data:" \
                and not p.source.lower().startswith(("http://", "https://")):
            raise bad("messages", f"{p.where}: {p.source!r:.100} names a file on the server, which a request may not "
                                  f"read: send the file itself, as a data URL ('data:{p.kind}/...;base64,...')"
                                  + (" or input_audio" if p.kind == "audio" else ""))


def parse_chat(body: Any, served: str, chat_ids, native=None, tokenizer=None) -> Job:
    """A /v1/chat/completions body. chat_ids: (messages, tools=None) -> prompt ids
    (Engine.chat_ids), which checks the messages (ArgumentError), reads their media (MediaError)
    and renders the model's template; native: the template's own tool format
    (metalkv.tool_formats), if it has one."""
    from ..errors import ArgumentError

    from ..tools import Tools, plain_tool_turns

    job = _common(body, "chat", served)
    if "messages" not in body:
        raise bad("messages", "required")
    try:
        job.tools = Tools.of(body.get("tools"), body.get("tool_choice"), body.get("parallel_tool_calls"))
    except ArgumentError as e:
        raise bad(e.argument, str(e)) from None
    messages, template_tools = body["messages"], None
    if job.tools is not None:
        if "response_format" in job.sampling or "grammar" in job.sampling:
            raise bad("response_format", "not with tools: a reply is held to the tools' format")
        job.tools = job.tools.using(native, tokenizer)
        messages = job.tools.messages(messages)
        job.sampling.update(job.tools.constraint())
        template_tools = job.tools.openai_tools() if native is not None else None
    if template_tools is None:
        turns = isinstance(messages, list) and any(isinstance(m, dict) and (m.get("role") == "tool" or m.get(
            "tool_calls")) for m in messages)
        if native is not None and turns:  # tool_choice "none" after tool turns: the template writes them
            template_tools = []
        else:
            messages = plain_tool_turns(messages)
    _no_server_files(messages)
    try:
        job.prompts = [chat_ids(messages, template_tools) if template_tools is not None else chat_ids(messages)]
    except ArgumentError as e:
        raise bad("messages", str(e)) from None
    except ValueError as e:  # the template refused the conversation (e.g. roles out of order); a MediaError
        raise bad("messages", str(e)) from None
    logprobs, top = _bool(body, "logprobs"), _int(body, "top_logprobs", 0, MAX_LOGPROBS)
    if top is not None and not logprobs:
        raise bad("top_logprobs", "needs logprobs: true")
    job.logprobs = (top or 0) if logprobs else None
    return job


def parse_completion(body: Any, served: str, encode, vocab: int) -> Job:
    """A /v1/completions body; prompt: a string, a list of token ids, or a list of either
    (one reply each). encode: text -> ids."""
    job = _common(body, "completion", served)
    prompt = body.get("prompt")
    if prompt is None:
        raise bad("prompt", "required")
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and _is_ids(prompt)):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise bad("prompt", "expected a string, a list of token ids, or a non-empty list of either")
    for i, p in enumerate(prompt):
        if isinstance(p, str):
            ids = encode(p)
        elif isinstance(p, list) and p and _is_ids(p):
            bad_ids = [t for t in p if not 0 <= t < vocab]
            if bad_ids:
                raise bad("prompt", f"token id {bad_ids[0]} is out of range: the vocabulary has {vocab} ids")
            ids = list(p)
        else:
            raise bad("prompt", f"prompt[{i}]: expected a non-empty string or a list of token ids")
        if not ids:
            raise bad("prompt", f"prompt[{i}]: empty")
        job.prompts.append(ids)
        job.prompt_texts.append(p if isinstance(p, str) else "")
    job.logprobs = _int(body, "logprobs", 0, MAX_LOGPROBS)
    job.echo = bool(_bool(body, "echo"))
    if job.echo and job.logprobs is not None:
        raise bad("echo", "not with logprobs: it would need the prompt's logprobs, which are not computed")
    if job.echo and any(not isinstance(p, str) for p in prompt):
        raise bad("echo", "needs text prompts, not token ids")
    _refuse_set(body, ("suffix",), "no fill-in-the-middle")
    return job


def _is_ids(p: list) -> bool:
    return all(isinstance(t, int) and not isinstance(t, bool) for t in p)


# ---- responses ----------------------------------------------------------------------------
FINISH = {"stop": "stop", "stop_string": "stop", "length": "length", "context_full": "length"}


def finish_reason(reason: str) -> str:
    """The engine's finish reason in OpenAI's words (a full context ends a reply as its length)."""
    return FINISH.get(reason, reason)


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def envelope(job: Job, chunk: bool) -> dict:
    kind = {("chat", False): "chat.completion", ("chat", True): "chat.completion.chunk"}.get(
        (job.kind, chunk), "text_completion")
    return {"id": job.id, "object": kind, "created": job.created, "model": job.model}


def chat_logprobs(entries: list, token_text) -> dict:
    """OpenAI's chat logprobs: {"content": [{token, logprob, bytes, top_logprobs}]}."""
    def one(i: int, lp: float) -> dict:
        text = token_text(i)
        return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}

    return {"content": [dict(one(tok, lp), top_logprobs=[one(i, l) for i, l in top])
                        for tok, (lp, top) in entries]}


def completion_logprobs(entries: list, token_text, offset: int) -> dict:
    """OpenAI's legacy completion logprobs: tokens, token_logprobs, top_logprobs, text_offset."""
    tokens, offsets = [], []
    for tok, _ in entries:
        offsets.append(offset)
        tokens.append(token_text(tok))
        offset += len(tokens[-1])
    return {"tokens": tokens, "token_logprobs": [lp for _, (lp, _) in entries],
            "top_logprobs": [{token_text(i): l for i, l in top} for _, (_, top) in entries],
            "text_offset": offsets}
