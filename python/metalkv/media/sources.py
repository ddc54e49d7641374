"""Where an image or a clip comes from, read into bytes: a local path (or a file:// URL), bytes,
a data URL (`data:image/png;base64,...`), or an http(s) URL when MediaLimits.allow_remote is on
(off by default: then a remote URL is refused, naming the switch).

Every read is capped by MediaLimits before the whole payload is held: a file by its size on
disk, a data URL by its length, a download as it streams in (never more than the cap and one
byte is read), so an oversized upload costs no decoding.
"""
from __future__ import annotations

import base64
import binascii
import http.client
import os
import pathlib
import time
import urllib.error
import urllib.parse
import urllib.request

from .errors import MediaError
from .limits import MediaLimits

_REMOTE = ("http://", "https://")


def describe(source) -> str:
    """A short name for `source` in messages: never the whole payload."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return "the bytes given"
    if isinstance(source, str) and source[:5].lower() == "data:":
        head = source.split(",", 1)[0]
        return f"the data URL '{head},...' ({len(source):,} characters)"
    if isinstance(source, str) and len(source) > 200:
        return f"'{source[:80]}...' ({len(source):,} characters)"
    if isinstance(source, (str, os.PathLike)):
        return repr(os.fspath(source))
    return f"a value of type {type(source).__name__}"


def decode_base64(text: str, kind: str, what: str, max_bytes: int) -> bytes:
    """The bytes of base64 `text` (line breaks allowed), refused past `max_bytes` before decoding."""
    text = "".join(text.split())
    if len(text) // 4 * 3 > max_bytes:
        raise _too_big(kind, what, len(text) // 4 * 3, max_bytes)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as e:
        raise MediaError(f"[{kind}] {what}: not valid base64 ({e}): encode the file's bytes with "
                         "standard base64 (A-Z, a-z, 0-9, +, /, = padding)") from None


def read_source(source, kind: str, limits: MediaLimits) -> bytes:
    """The bytes of an image (`kind` 'image') or a clip ('audio') given as bytes, a path or a data URL."""
    max_bytes = limits.max_image_bytes if kind == "image" else limits.max_audio_bytes
    what = describe(source)
    if isinstance(source, (bytes, bytearray, memoryview)):
        if len(source) > max_bytes:
            raise _too_big(kind, what, len(source), max_bytes)
        return bytes(source)
    if isinstance(source, str) and source[:5].lower() == "data:":
        return _data_url(source, kind, what, max_bytes)
    if isinstance(source, str) and source.lower().startswith(_REMOTE):
        if not limits.allow_remote:
            raise _remote(kind, what)
        return fetch(source, kind, what, max_bytes, limits.fetch_timeout_s)
    if isinstance(source, str) and source[:7].lower() == "file://":
        return _read_file(_file_url_path(source, kind, what), kind, what, max_bytes)
    if isinstance(source, str) and len(source) > 1024:  # no path is this long: base64 sent bare, most likely
        raise MediaError(f"[{kind}] {what}: not a path nor a data URL; to send the file itself, give its bytes "
                         f"or a data URL ('data:{kind}/...;base64,' before the base64)")
    if isinstance(source, (str, os.PathLike)):
        return _read_file(pathlib.Path(source), kind, what, max_bytes)
    raise MediaError(f"[{kind}] {what}: not a media source: give a path, bytes, or a data URL "
                     f"('data:{kind}/...;base64,...')")


def _data_url(url: str, kind: str, what: str, max_bytes: int) -> bytes:
    head, sep, payload = url.partition(",")
    params = head[5:].split(";")
    media_type = params[0].strip().lower()
    if not sep or "base64" not in (p.strip().lower() for p in params[1:]):
        raise MediaError(f"[{kind}] {what}: not a base64 data URL: expected 'data:{kind}/<type>;base64,<data>'")
    if media_type and not media_type.startswith(kind + "/"):
        raise MediaError(f"[{kind}] {what}: holds '{media_type}', not {kind} data: expected a '{kind}/...' media type")
    return decode_base64(payload, kind, what, max_bytes)


def _read_file(path: pathlib.Path, kind: str, what: str, max_bytes: int) -> bytes:
    try:
        if path.is_dir():
            raise MediaError(f"[{kind}] {what}: a directory; give the path of an {kind} file")
        size = path.stat().st_size
        if size > max_bytes:
            raise _too_big(kind, what, size, max_bytes)
        with path.open("rb") as f:
            data = f.read(max_bytes + 1)  # the file may have grown since stat
    except FileNotFoundError:
        raise MediaError(f"[{kind}] {what}: no such file (a local path, relative to {os.getcwd()!r})") from None
    except OSError as e:
        raise MediaError(f"[{kind}] {what}: cannot be read: {e.strerror or e}") from None
    if len(data) > max_bytes:
        raise _too_big(kind, what, len(data), max_bytes)
    return data


def _too_big(kind: str, what: str, size: int | None, max_bytes: int) -> MediaError:
    """size None: a download stopped one byte past the limit (its whole size is not known)."""
    option = "max_image_bytes" if kind == "image" else "max_audio_bytes"
    said = "more bytes than" if size is None else f"{size:,} bytes, over"
    return MediaError(f"[{kind}] {what}: {said} the limit of {max_bytes:,} "
                      f"(MediaLimits.{option}): send a smaller file or raise the limit")


def _remote(kind: str, what: str) -> MediaError:
    return MediaError(f"[{kind}] {what}: a remote URL, and fetching media is off: download the file and give its "
                      "local path or a data URL, or turn fetching on (`metalkv serve --allow-remote-media`; "
                      "MediaLimits(allow_remote=True) in Python)")


def _file_url_path(url: str, kind: str, what: str) -> pathlib.Path:
    """The local path of a file:// URL (file:///tmp/a.png, file://localhost/tmp/a.png)."""
    parts = urllib.parse.urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise MediaError(f"[{kind}] {what}: a file URL of host {parts.netloc!r}; only this machine's files are "
                         "read (file:///path)")
    return pathlib.Path(urllib.request.url2pathname(parts.path))


def fetch(url: str, kind: str, what: str, max_bytes: int, timeout_s: float) -> bytes:
    """The body of an http(s) URL: refused unless the answer is 2xx, past max_bytes (read as it
    streams, at most max_bytes + 1 bytes), or once timeout_s has passed (each wait for the server
    is that long at most, and the whole fetch is checked between reads)."""
    deadline = time.monotonic() + timeout_s
    request = urllib.request.Request(url, headers={"User-Agent": "metalkv"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            if not 200 <= response.status < 300:  # (urllib raises for 4xx and 5xx; this is the rest)
                raise _not_fetched(kind, what, f"the server answered {response.status} {response.reason}")
            length = response.headers.get("Content-Length", "")
            if length.isdigit() and int(length) > max_bytes:
                raise _too_big(kind, what, int(length), max_bytes)
            chunks, size = [], 0
            while size <= max_bytes:
                if time.monotonic() > deadline:
                    raise TimeoutError
                chunk = response.read1(min(1 << 16, max_bytes + 1 - size))  # what has come, not a full 64 KiB
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
    except MediaError:
        raise
    except urllib.error.HTTPError as e:
        e.close()
        raise _not_fetched(kind, what, f"the server answered {e.code} {e.reason}") from None
    except (TimeoutError, urllib.error.URLError) as e:
        reason = getattr(e, "reason", e)
        if isinstance(e, TimeoutError) or isinstance(reason, TimeoutError):
            raise _not_fetched(kind, what, f"no whole answer within {timeout_s:g} s "
                                           "(MediaLimits.fetch_timeout_s)") from None
        raise _not_fetched(kind, what, f"cannot be fetched ({reason})") from None
    except (OSError, http.client.HTTPException, ValueError) as e:
        raise _not_fetched(kind, what, f"cannot be fetched ({type(e).__name__}: {e})") from None
    if size > max_bytes:
        raise _too_big(kind, what, None, max_bytes)
    return b"".join(chunks)


def _not_fetched(kind: str, what: str, why: str) -> MediaError:
    return MediaError(f"[{kind}] {what}: {why}; check the URL, or download the file and give its local path")
