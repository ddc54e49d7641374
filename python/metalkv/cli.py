"""The `metalkv` command line.

    metalkv generate "Why is the sky blue?"     # default model, streams the answer
    echo "Why is the sky blue?" | metalkv generate -
    metalkv chat --system "You are terse."      # interactive; the cache persists between turns
    metalkv generate "What is in it?" --image photo.jpg --model gemma-3-4b-it   # (docs/MULTIMODAL.md)
    metalkv devices

Generated text goes to stdout; loading progress and the closing line (speed,
finish reason, context used) go to stderr, so `metalkv generate ... > out.txt`
captures only the text. Flags are checked before the model loads (cli_checks.py);
a mistake in them exits 2 with one line naming the flag. Ctrl-C stops `generate`
(exit 130); in `chat` it stops the reply and keeps the session.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import warnings
from pathlib import Path

from .cli_checks import CliError, check_against_model, check_flags, check_media, in_flags, user_words
from .cli_flags import (_add_engine_flags, _add_kv_flags, _add_media_flags, _add_model_flags,  # noqa: F401
                        _add_serve_flags, _kv_given, constraint_fields)

EXIT_USAGE, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_PIPE = 2, 1, 130, 141
FINISH = {  # finish reasons in words, for the closing line
    "stop": "stop (the model ended its turn)", "stop_string": "stop_string (a --stop string)",
    "length": "length (--max-tokens reached)", "context_full": "context_full (the cache is full)",
    "cancelled": "cancelled",
}


class _Parser(argparse.ArgumentParser):
    """argparse, with a mistake said in one line and where to look (not the usage block)."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"metalkv: warning: {in_flags(str(message))}", file=sys.stderr)


# ---- flags -------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = _Parser(prog="metalkv", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"metalkv {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text for a prompt, streamed to stdout")
    gen.add_argument("prompt", help="the prompt; '-' reads it from standard input")
    gen.add_argument("--no-chat", action="store_true", help="feed the prompt as plain text, no chat template")
    _add_media_flags(gen)
    _add_model_flags(gen)
    gen.set_defaults(fn=cmd_generate)
    chat = sub.add_parser("chat", help="interactive chat; the KV cache carries the conversation")
    _add_model_flags(chat)
    chat.set_defaults(fn=cmd_chat)
    ppl = sub.add_parser("ppl", help="decode-time perplexity of the KV cache's formats against the f16 cache")
    ppl.add_argument("text", help="a UTF-8 text file of held-out text, e.g. a public-domain book (a few "
                                  "thousand words or more)")
    ppl.add_argument("--tokens", type=int, default=512, help="tokens scored (default: %(default)s)")
    ppl.add_argument("--chunk", type=int, default=16,
                     help="ids fed per call: each chunk's logits attend to the cache as stored (default: %(default)s)")
    ppl.add_argument("--json", action="store_true", help="print the rows as JSON")
    _add_engine_flags(ppl)
    ppl.set_defaults(fn=cmd_ppl)
    serve = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (docs/SERVER.md)")
    _add_serve_flags(serve)
    serve.set_defaults(fn=cmd_serve)
    sub.add_parser("devices", help="list the devices metalkv can run on").set_defaults(fn=cmd_devices)
    return parser


def _sampling(args: argparse.Namespace) -> dict:
    """The generate options of the flags, checked by the engine's own checks before
    any model is read; a bad value is reported with its flag's name."""
    from .engine import Sampling, _check_stop
    from .errors import ArgumentError
    from .model_spec import check_context

    try:
        constraint_fields(args)
        s = {f.name: getattr(args, f.name) for f in dataclasses.fields(Sampling)}
        Sampling(**s).check()
        _check_stop(args.stop)
        check_context(args.context)
    except ArgumentError as e:
        raise CliError(user_words(e)) from None
    if args.system is not None and getattr(args, "no_chat", False):
        raise CliError("--system needs the chat template; drop --no-chat")
    return dict(s, stop=args.stop, system=args.system)


def chat_template_file(path: str, model_template):
    """--chat-template FILE: that template, with the model's BOS and EOS text."""
    from .models.chat import ChatTemplate, ChatTemplateError

    try:
        source = Path(path).read_text(encoding="utf-8")
        return ChatTemplate(source, bos_token=model_template.bos_token, eos_token=model_template.eos_token)
    except OSError as e:
        raise CliError(f"--chat-template {path}: cannot read it ({e.strerror})") from None
    except ChatTemplateError as e:
        raise CliError(f"--chat-template {path}: {e}") from None


def _load(args: argparse.Namespace, kv: bool = True, **kw):
    """Engine.load with the engine flags (kv: the --kv-* ones too); kw overrides them. The
    flags are checked first, then against the model file's header, then the weights load."""
    import metalkv
    from .models import load_model

    given = _kv_given(args) if kv else {}
    opts = check_flags(args, given)
    loaded = load_model(args.model, quantize=args.quantize)
    if getattr(args, "chat_template", None):
        loaded.chat_template = chat_template_file(args.chat_template, loaded.chat_template)
    check_against_model(args, opts, loaded.config)
    kw = dict(given, **kw)
    kw.setdefault("context", args.context)
    kw.setdefault("preempt", getattr(args, "preempt", True))
    if getattr(args, "draft_model", None):
        kw.setdefault("draft", args.draft_model)
    if getattr(args, "kv_share", None):
        kw.setdefault("kv_share", args.kv_share)
    if getattr(args, "mmproj", None):
        kw.setdefault("mmproj", args.mmproj)
    return metalkv.Engine.load(loaded, device=args.device, quantize=args.quantize, **kw)


def _save(cache, path: str) -> bool:
    """--save-cache: the cache written (atomically: a failed save keeps the previous file),
    or one line saying why not."""
    from .errors import CacheFileError

    try:
        cache.save(path)
        return True
    except (OSError, CacheFileError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else user_words(e)
        print(f"metalkv: error: the KV cache was not saved to {path}: {reason}"
              f"{' (the file there is unchanged)' if os.path.exists(path) else ''}", file=sys.stderr)
        return False


# ---- output ------------------------------------------------------------------------------
def _closing_line(stats: dict, cache) -> str:
    return (f"[{int(stats['prompt_tokens'])} prompt tokens at {stats['prefill_tok_s']:.1f} tok/s, "
            f"{int(stats['generated_tokens'])} generated at {stats['decode_tok_s']:.2f} tok/s; "
            + (f"{stats['draft_accepted']} of {stats['draft_proposed']} proposed ids accepted; "
               if stats.get("draft_proposed") else "")
            + f"finish: {FINISH.get(stats['finish_reason'], stats['finish_reason'])}; "
            f"{_context_used(cache)}]")


def _context_used(cache) -> str:
    """'context 96/4096 tokens', or with an eviction policy what a full layer keeps of its budget."""
    if cache.policy == "none":
        return f"context {cache.length(0)}/{cache.capacity} tokens"
    full = next(l for l in range(cache.n_layers) if cache.evicts(l))
    return (f"{cache.policy}: {cache.count(full)}/{cache.budget} tokens kept of {cache.length(full)}, "
            f"{cache.evicted} evicted")


def _stream_reply(engine, stream, prompt, cache, **options) -> None:
    """stream(prompt, ...)'s pieces to stdout; a long prompt's reading shows a bar on stderr."""
    from .models.progress import PromptProgress

    bar = PromptProgress()
    try:
        for piece in stream(prompt, cache=cache, progress=bar, **options):
            bar.close()
            sys.stdout.write(piece)
            sys.stdout.flush()
    finally:
        bar.close()
    sys.stdout.write("\n")
    sys.stdout.flush()


# ---- commands ----------------------------------------------------------------------------
def cmd_generate(args: argparse.Namespace) -> int:
    options = _sampling(args)
    check_media(args)
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        raise CliError("the prompt is empty" + (" (standard input had no text)" if args.prompt == "-" else ""))
    engine = _load(args)
    cache = _first_cache(engine, args)
    if args.media:
        _generate_with_media(engine, cache, prompt, args.media, options)
    else:
        _stream_reply(engine, engine.stream, prompt, cache, chat=not args.no_chat, **options)
    print(_closing_line(engine.last_stats, cache), file=sys.stderr)
    if args.save_cache and not _save(cache, args.save_cache):
        return EXIT_FAILED
    return 0


def _generate_with_media(engine, cache, prompt: str, media: list, options: dict) -> None:
    """--image/--audio: the files, then the prompt's text, in one user message after the cache's conversation."""
    from .cli_media import media_content, media_refusal
    from .errors import ArgumentError

    messages = _opening_messages(cache, options.pop("system"))
    turn = messages + [{"role": "user", "content": media_content(media, prompt)}]
    try:
        _stream_reply(engine, engine.chat_stream, turn, cache, **options)
    except ArgumentError as e:
        if e.argument != "messages":
            raise
        raise CliError(media_refusal(e, media, len(messages))) from None


def _first_cache(engine, args: argparse.Namespace):
    """The cache of --load-cache, or a new one."""
    if not args.load_cache:
        return engine.new_cache()
    cache = engine.load_cache(args.load_cache)
    print(f"[loaded {args.load_cache}: {cache.length(0)} tokens, {len(cache.messages)} messages]", file=sys.stderr)
    return cache


CHAT_HELP = ("type a message; /reset starts over, /exit (or Ctrl-D) quits, /help shows this, Ctrl-C stops a "
             "reply; /image FILE and /audio FILE attach a file to your next message; a message that starts with / "
             "begins with // (sent as one /).")


def _opening_messages(cache, system: str | None) -> list[dict]:
    """The conversation a chat starts from: the loaded cache's, with --system (if given) as its system prompt."""
    messages = [m for m in cache.messages if system is None or m["role"] != "system"]
    return ([{"role": "system", "content": system}] if system is not None else []) + messages


def cmd_chat(args: argparse.Namespace) -> int:
    from .cli_media import Attachments, media_refusal
    from .errors import ArgumentError

    options = _sampling(args)
    system = options.pop("system")
    engine = _load(args)
    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:
        pass
    cache = _first_cache(engine, args)
    messages = _opening_messages(cache, system)
    attached = Attachments()
    print(f"metalkv chat: {CHAT_HELP}", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            print(file=sys.stderr)
            return 0
        except KeyboardInterrupt:
            print("\n[/exit or Ctrl-D quits]", file=sys.stderr)
            continue
        command = line.strip()
        if command in ("/exit", "/quit"):
            return 0
        if command == "/reset":
            cache.reset()
            messages = _opening_messages(cache, system)
            print("[conversation cleared" + (", system prompt kept" if system else "")
                  + (f", {attached.names()} dropped]" if attached.pending else "]"), file=sys.stderr)
            attached.clear()
            continue
        if command in ("/help", "/?"):
            print(f"[{CHAT_HELP}]", file=sys.stderr)
            continue
        if not command or attached.command(command):
            continue
        if command.startswith("/") and not command.startswith("//"):
            print(f"[unknown command {command.split()[0]}: {CHAT_HELP}]", file=sys.stderr)
            continue
        if command.startswith("//"):
            line = line.replace("//", "/", 1)
        turn = messages + [{"role": "user", "content": attached.content(line)}]
        try:  # the cache holds the conversation so far: only the new message is computed
            _stream_reply(engine, engine.chat_stream, turn, cache, **options)
        except KeyboardInterrupt:
            sys.stdout.write("\n")
            kept = engine.last_stats.get("generated_tokens", 0) > 0
            if kept:
                messages = _after(turn, cache)
                attached.clear()
            print("[interrupted: " + ("your message and the reply so far stay in the conversation]" if kept
                                      else "nothing of this turn was kept]"), file=sys.stderr)
            continue
        except ArgumentError as e:
            if e.argument == "messages" and attached.pending:  # (a text model refusing an image, say)
                print(f"[{media_refusal(e, attached.pending, len(messages), said='/')}; {attached.names()} dropped]",
                      file=sys.stderr)
                attached.clear()
                continue
            if e.argument != "prompt":
                raise
            print(f"[this message does not fit: the context holds {cache.capacity} tokens and "
                  f"{cache.length(0)} are used. /reset starts over; --context sets a larger cache]", file=sys.stderr)
            continue
        messages = _after(turn, cache)  # the turn, its reply included
        attached.clear()
        print(_closing_line(engine.last_stats, cache), file=sys.stderr)
        if args.save_cache:
            _save(cache, args.save_cache)  # (a failure is said; the conversation goes on)
        if engine.last_stats["finish_reason"] == "context_full":
            print(f"[the context is full ({cache.length(0)}/{cache.capacity} tokens): /reset starts over; "
                  f"restart with a larger --context to keep longer conversations]", file=sys.stderr)


def _after(turn: list[dict], cache) -> list[dict]:
    """The conversation after a turn: the messages as sent (media parts keep their files), then
    what the cache added (the reply)."""
    held = list(cache.messages)
    return turn + held[len(turn):] if len(held) >= len(turn) else held


def cmd_ppl(args: argparse.Namespace) -> int:
    import json

    from .errors import ArgumentError
    from .kv_options import kv_options
    from .ppl import format_table, score, text_ids

    if args.tokens < 1 or args.chunk < 1:
        raise CliError("--tokens and --chunk must be positive")
    given = {k: v for k, v in _kv_given(args).items() if k != "kv_memory"}
    try:
        kv_options("ppl", **given).check_together("ppl")  # checked before the model is read
    except ArgumentError as e:
        raise CliError(user_words(e)) from None
    if not os.path.isfile(args.text):
        raise CliError(f"{args.text}: no such file")
    # caches of several formats from one engine: each its own pool; the engine's own are f16
    engine = _load(args, kv=False, kv_memory=None, context=max(args.context or 0, args.tokens + 1))
    try:
        ids = text_ids(engine, args.text, args.tokens)
    except (OSError, ValueError) as e:
        raise CliError(str(e)) from None
    shape = (engine.n_kv_layers, engine.config.head_dim, args.tokens)
    opts = kv_options("ppl", **given)
    try:
        resolved = opts.resolve(*shape)  # (a budget's fraction: of --tokens, the cache the text fills)
    except ArgumentError as e:
        raise CliError(user_words(e)) from None
    candidates = {}
    if resolved["quantized"] or resolved["kv_policy"] != "none":
        if resolved["kv_policy"] != "none":
            given["kv_budget"] = resolved["kv_budget"]
        candidates = {opts.describe(*shape): given}
    results = score(engine, ids, candidates, chunk=args.chunk)
    if args.json:
        print(json.dumps([r.row() for r in results], indent=1))
    else:
        print(format_table(results))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import dataclasses as dc

    from .engine import Sampling
    from .errors import ArgumentError

    try:
        from .server import bind, serve
    except ImportError as e:
        raise CliError(f"metalkv serve needs the server extra ({e.name} is missing): pip install 'metalkv[server]'")
    defaults = {f.name: getattr(args, f.name) for f in dc.fields(Sampling)
                if f.name != "max_tokens" and getattr(args, f.name, None) is not None}
    try:
        Sampling(**defaults).check()
        if args.max_tokens is not None and args.max_tokens < 1:
            raise CliError(f"--max-tokens {args.max_tokens}: expected a positive int")
    except ArgumentError as e:
        raise CliError(user_words(e)) from None
    if not 0 < args.port < 65536:
        raise CliError(f"--port {args.port}: expected 1..65535")
    if args.max_calls < 1:
        raise CliError(f"--max-calls {args.max_calls}: expected a positive int")
    if args.prefix_store_redis and not args.prefix_store:
        raise CliError("--prefix-store-redis: needs --prefix-store DIR (the local tiers it goes beside)")
    if args.prefix_store:  # the sizes, before the model loads
        from .prefix_store import check_size

        try:
            check_size(args.prefix_store_size, "disk_bytes"), check_size(args.prefix_store_host, "host_bytes")
        except ArgumentError as e:
            raise CliError(user_words(e)) from None
    api_key = args.api_key or os.environ.get("METALKV_API_KEY") or None
    sock = bind(args.host, args.port)  # a busy port is said before the model loads (AddressError, exit 2)
    engine = _load(args, max_seqs=args.max_seqs, batch_invariant=args.batch_invariant)
    if args.allow_remote_media:  # (what the engine's media layer reads a message's URLs with)
        engine.media_limits = dc.replace(engine.media_limits, allow_remote=True)
    store = None
    if args.prefix_store:
        from .prefix_store import PrefixStore

        try:
            store = PrefixStore(engine, args.prefix_store, disk_bytes=args.prefix_store_size,
                                host_bytes=args.prefix_store_host, redis=args.prefix_store_redis)
        except ArgumentError as e:
            raise CliError(user_words(e)) from None
        except OSError as e:
            raise CliError(f"--prefix-store {args.prefix_store}: {e.strerror}") from None
    name = args.model_name or engine.model_path.name.removesuffix(".gguf")
    if args.host not in ("127.0.0.1", "localhost", "::1") and api_key is None:
        print(f"metalkv serve: warning: listening on {args.host} with no --api-key: anyone who reaches this "
              f"machine can use the model", file=sys.stderr)
    serve(engine, host=args.host, sock=sock, shutdown_timeout=args.shutdown_timeout, model_name=name,
          ready=lambda url: print(f"metalkv serve: {name} at {url}/v1 (Ctrl-C stops)", file=sys.stderr),
          api_key=api_key, max_calls=args.max_calls, defaults=defaults, max_tokens=args.max_tokens,
          prefix_store=store)
    return 0


def cmd_devices(args: argparse.Namespace) -> int:
    import metalkv

    for kind in metalkv.devices():
        dev = metalkv.device(kind)
        print(f"{kind}: {dev.name}")
    return 0


def _quiet_stdout() -> None:
    """After a closed pipe: send what is left (and the interpreter's final flush) nowhere."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from ._core import GpuError

    if getattr(args, "draft_model", None) and "speculate" in args and args.speculate is None:
        args.speculate = "draft"  # a draft model given is a draft model used

    warnings.showwarning = _one_line_warning
    try:
        return args.fn(args)
    except CliError as e:
        print(f"metalkv: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as e:  # model files, arguments the engine refused: the message says why
        print(f"metalkv: error: {user_words(e)}", file=sys.stderr)
        return EXIT_USAGE
    except GpuError as e:  # the device failed
        print(f"metalkv: error: {in_flags(str(e))}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("\n[interrupted]", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `metalkv generate ... | head`: the reader has gone
        _quiet_stdout()
        return EXIT_PIPE


if __name__ == "__main__":
    sys.exit(main())
