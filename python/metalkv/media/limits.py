"""What media metalkv accepts: one object, checked once, passed down to every decoder.

    MediaLimits()                                   the defaults below
    MediaLimits(max_audio_seconds=10)               stricter for a server
    MediaLimits(allow_remote=True)                  http(s) URLs fetched (`metalkv serve --allow-remote-media`)
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import argument_error

MIB = 1 << 20


@dataclass(frozen=True)
class MediaLimits:
    max_image_bytes: int = 32 * MIB
    # 8192 x 8192: below Pillow's own decompression-bomb guard (a warning from 89.5 MP, an error
    # from 179 MP), so ours is the one a user meets; an RGB image this size is 192 MiB decoded.
    max_image_pixels: int = 8192 * 8192
    max_audio_bytes: int = 32 * MIB
    # Gemma 3n's: its feature extractor keeps the first 480,000 samples at 16 kHz and its prompt
    # holds 188 audio tokens, as many as 30 s give; metalkv refuses longer clips rather than cut them.
    max_audio_seconds: float = 30.0
    # Off by default: a server that fetches what a client names can be made to reach any address
    # its machine can (its own network included).
    allow_remote: bool = False
    fetch_timeout_s: float = 10.0  # the whole fetch, connection to last byte

    def __post_init__(self):
        for name in ("max_image_bytes", "max_image_pixels", "max_audio_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise argument_error("media", name, value, "a positive int")
        s = self.max_audio_seconds
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not s > 0:
            raise argument_error("media", "max_audio_seconds", s, "a positive number of seconds")
        t = self.fetch_timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < float("inf"):
            raise argument_error("media", "fetch_timeout_s", t, "a positive, finite number of seconds")
        if not isinstance(self.allow_remote, bool):
            raise argument_error("media", "allow_remote", self.allow_remote, "True or False")
