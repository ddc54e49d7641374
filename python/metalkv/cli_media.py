"""Images and audio on the command line: `metalkv generate --image FILE --audio FILE` and chat's
`/image FILE`, `/audio FILE`. The files go in one user message as content parts, before its
text, in the order given; the engine reads them (docs/MULTIMODAL.md "CLI")."""
from __future__ import annotations

import os
import re
import shlex
import sys

from .cli_checks import CliError, check_media_file, user_words

COMMANDS = ("/image", "/audio")


def media_content(media: list[tuple[str, str]], text: str) -> list[dict]:
    """A user message's content: each (kind, path) as a part, then the text."""
    parts = [{"type": "image_url", "image_url": {"url": path}} if kind == "image" else {"type": "audio", "path": path}
             for kind, path in media]
    return parts + [{"type": "text", "text": text}]


def media_refusal(e: Exception, media: list[tuple[str, str]], message_index: int, said: str = "--") -> str:
    """The engine's refusal of a message (ArgumentError, argument 'messages') in the CLI's words:
    a part of ours is named as the user gave it (`--image photo.jpg: this model reads text only; ...`;
    said '/': chat's `/image photo.jpg: ...`)."""
    m = re.match(r"\[\w+\] messages\[(\d+)\]\.content\[(\d+)\][^:]*: (.*)", str(e), re.S)
    if m and int(m.group(1)) == message_index and int(m.group(2)) < len(media):
        kind, path = media[int(m.group(2))]
        return f"{said}{kind} {path}: {m.group(3)}"
    return user_words(e)


def _unquoted(path: str) -> str:
    """A path as a terminal pastes a dropped file: 'my photo.jpg' or my\\ photo.jpg, as the file's name."""
    try:
        words = shlex.split(path)
    except ValueError:  # an unbalanced quote: taken as typed
        return path
    return words[0] if len(words) == 1 else path


class Attachments:
    """chat's files waiting for the next user message."""

    def __init__(self):
        self.pending: list[tuple[str, str]] = []

    def command(self, line: str) -> bool:
        """Handles `/image FILE` or `/audio FILE` (True), saying what is attached; False for other lines."""
        word, _, path = line.strip().partition(" ")
        if word not in COMMANDS:
            return False
        kind, path = word[1:], _unquoted(path.strip())
        try:
            if not path:
                raise CliError(f"{word} needs a file: {word} {'photo.jpg' if kind == 'image' else 'clip.wav'}")
            check_media_file(kind, path, f"{word} {path}")
        except CliError as e:
            print(f"[{e}]", file=sys.stderr)
            return True
        self.pending.append((kind, path))
        print(f"[attached {os.path.basename(path)}; for your next message: {self.names()}]", file=sys.stderr)
        return True

    def names(self) -> str:
        return ", ".join(os.path.basename(p) for _, p in self.pending)

    def content(self, text: str) -> str | list[dict]:
        """The next user message's content: the text alone, or the files then the text."""
        return media_content(self.pending, text) if self.pending else text

    def clear(self) -> None:
        self.pending = []
