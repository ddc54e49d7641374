"""What the CLI checks before the model loads, and errors in the words the user typed.

Flags are checked in three rounds, each before anything slower: the values alone
(argparse, the engine's own checks: check_flags), then what the model file's header
says (layer indices, the context it was trained for: check_against_model), then
the weights load. Every message names the flag (`--kv-residual 100: ...`), not the
keyword the API would (`kv_residual=100`): user_words() rewrites the core's
ArgumentError and the names in any message from one table, the KV options' own
(_core.KV_OPTIONS) plus the few the engine words as the API does.
"""
from __future__ import annotations

import argparse
import os
import re

from .kv_options import KV_OPTIONS

# The API's words for what a flag sets, where the flag's name is not the keyword's.
_FLAG_OF = {"capacity": "--context", "context": "--context", "max_seqs": "--max-seqs",
            "disk_bytes": "--prefix-store-size", "host_bytes": "--prefix-store-host"}
# Phrases of the API's messages and what the CLI says instead.
_PHRASES = {
    "new_cache(capacity=...) or Engine.load(context=...)": "--context",
    "Engine.load(context=...)": "--context",
    "create the cache with a larger capacity": "a larger --context",
    "speculate='lookup'": "--speculate lookup",
    "speculate='draft'": "--speculate draft",
}
_KV_NAMES = re.compile(r"\b(" + "|".join(sorted((row["name"] for row in KV_OPTIONS), key=len, reverse=True)) + r")\b")


class CliError(Exception):
    """A mistake in what the user typed: printed as `metalkv: error: ...`, exit 2."""


def flag(argument: str) -> str:
    return _FLAG_OF.get(argument) or "--" + argument.replace("_", "-")


def in_flags(text: str) -> str:
    """text with the API's names of options written as the flags that set them."""
    for phrase, said in _PHRASES.items():
        text = text.replace(phrase, said)
    return _KV_NAMES.sub(lambda m: flag(m.group(1)), text)


def user_words(e: Exception) -> str:
    """An error's message as the CLI says it: `--flag value: expected ...` for an
    ArgumentError with a value, else the message without its `[op] ` prefix, names as flags."""
    argument, value = getattr(e, "argument", ""), getattr(e, "value", "")
    if argument and value:  # (a flag left out is the API's None: not a value one types)
        expected = re.sub(r"^None(, | or )", "", e.expected)
        return f"{flag(argument)} {value}: expected {in_flags(expected)}"
    # one line: a compiler's message (a grammar's, with its caret under the position) joined up
    return in_flags(" ".join(re.sub(r"^\[[\w.]+\] ", "", str(e)).split()))


def check_device(kind: str) -> None:
    """--device: one this machine has (a flag's mistake, exit 2, not a device failure)."""
    import metalkv

    have = metalkv.devices()
    if kind != "auto" and kind not in have:
        raise CliError(f"--device {kind}: not available on this machine (available: {', '.join(have)}; "
                       f"auto picks the best)")


def check_writable(path: str, what: str) -> None:
    """A file the command will write at the end (--save-cache): its folder exists and is
    writable, and it is not a folder, so nothing is lost after the work is done."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise CliError(f"{what} {path}: is a folder; give a file name such as {os.path.join(path, 'chat.safetensors')}")
    if not os.path.isdir(folder):
        raise CliError(f"{what} {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise CliError(f"{what} {path}: the folder {folder} is not writable")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise CliError(f"{what} {path}: the file is not writable")


def check_media_file(kind: str, path: str, said: str) -> None:
    """An image or clip the command will send: a file that exists and can be read (its content is
    the engine's to check). said: how the user named it ('--image photo.jpg', '/image photo.jpg')."""
    if os.path.isdir(path):
        raise CliError(f"{said}: is a folder; give an {kind} file")
    try:
        with open(path, "rb"):
            pass
    except FileNotFoundError:
        raise CliError(f"{said}: no such file") from None
    except OSError as e:
        raise CliError(f"{said}: cannot read it ({e.strerror or e})") from None


def check_media(args: argparse.Namespace) -> None:
    """generate's --image and --audio: files that can be read, and a chat to put them in."""
    media = getattr(args, "media", None) or []
    if media and getattr(args, "no_chat", False):
        raise CliError(f"--{media[0][0]} needs the chat template (the files go in a user message, as content "
                       "parts); drop --no-chat")
    for kind, path in media:
        check_media_file(kind, path, f"--{kind} {path}")


def check_flags(args: argparse.Namespace, kv_given: dict):
    """The flags whose values can be checked without the model; returns the KV options."""
    from .cache_file import check_file
    from .errors import ArgumentError, CacheFileError
    from .kv_options import kv_options

    check_device(args.device)
    try:
        opts = kv_options("engine", **kv_given)
        opts.check_together("engine")
    except ArgumentError as e:
        raise CliError(user_words(e)) from None
    if getattr(args, "save_cache", None):
        check_writable(args.save_cache, "--save-cache")
    if getattr(args, "load_cache", None):
        try:
            check_file(args.load_cache)
        except CacheFileError as e:
            raise CliError("--load-cache " + user_words(e)) from None
    return opts


def check_against_model(args: argparse.Namespace, opts, cfg) -> None:
    """The flags that need the model file's header (its layers, head size, context length)."""
    from .errors import ArgumentError
    from .model_spec import default_capacity

    if args.context is not None and cfg.context_length and args.context > cfg.context_length:
        raise CliError(f"--context {args.context}: the model was trained for {cfg.context_length} positions; "
                       f"its output past them is not meaningful (use at most {cfg.context_length})")
    try:
        opts.resolve(cfg.n_layers, cfg.head_dim, default_capacity(cfg, args.context))
    except ArgumentError as e:
        raise CliError(user_words(e)) from None
