"""Remote media behind MediaLimits.allow_remote: off, a URL is refused naming the switch; on, it
is fetched with a time limit and the byte cap enforced as the body streams in. The server is
the standard library's http.server on 127.0.0.1, in a thread of the test: no network."""
from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from metalkv.media import MediaError, MediaLimits, load_audio, load_image
from metalkv.media import sources

from .drawn import encode, gradient
from .sounds import signal, wav_of

PNG = encode(gradient(40, 30), "PNG")
WAV = wav_of(signal("tone", 1600), 16_000)
ON = MediaLimits(allow_remote=True)


class Handler(BaseHTTPRequestHandler):
    """/img.png, /clip.wav; /missing (404); /big (a declared 5,000 bytes); /endless (no length,
    bytes until the client goes); /slow (answers after 2 s); /trickle (a byte every 50 ms)."""

    def do_GET(self):
        if self.path in ("/img.png", "/clip.wav"):
            return self.answer(200, PNG if self.path == "/img.png" else WAV)
        if self.path == "/big":
            return self.answer(200, b"x" * 5000)
        if self.path == "/slow":
            time.sleep(2)
            return self.answer(200, PNG)
        if self.path in ("/endless", "/trickle"):
            self.send_response(200)
            self.end_headers()
            try:
                for _ in range(2000):
                    self.wfile.write(b"y" * (1 if self.path == "/trickle" else 4096))
                    self.wfile.flush()
                    if self.path == "/trickle":
                        time.sleep(0.05)
            except OSError:  # the client stopped reading
                pass
            return None
        return self.answer(404, b"not here")

    def answer(self, status: int, body: bytes):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # quiet
        pass


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_off_by_default_and_the_refusal_names_the_switch(server):
    for load in (load_image, load_audio):
        with pytest.raises(MediaError, match=r"a remote URL, and fetching media is off: download the file .* \("
                                             r"`metalkv serve --allow-remote-media`; MediaLimits\(allow_remote=True\)"):
            load(f"{server}/img.png")


def test_an_image_and_a_clip_are_fetched(server):
    assert np.array_equal(np.asarray(load_image(f"{server}/img.png", ON)), np.asarray(load_image(PNG)))
    assert np.array_equal(load_audio(f"{server}/clip.wav", limits=ON), load_audio(WAV))


def test_an_error_status_names_the_url(server):
    with pytest.raises(MediaError, match=rf"\[image\] '{server}/missing': the server answered 404 Not Found; "
                                         r"check the URL"):
        load_image(f"{server}/missing", ON)


def test_the_byte_cap_holds_with_and_without_a_declared_length(server):
    small = MediaLimits(allow_remote=True, max_image_bytes=1000)
    with pytest.raises(MediaError, match=r"'.*/big': 5,000 bytes, over the limit of 1,000 \(MediaLimits.max_image_"):
        load_image(f"{server}/big", small)
    with pytest.raises(MediaError, match=r"'.*/endless': more bytes than the limit of 1,000 \(MediaLimits"):
        load_image(f"{server}/endless", small)


def test_a_slow_server_runs_into_the_timeout(server):
    quick = MediaLimits(allow_remote=True, fetch_timeout_s=0.3)
    for path in ("/slow", "/trickle"):  # no answer in time; an answer that never ends in time
        start = time.monotonic()
        with pytest.raises(MediaError, match=rf"'.*{path}': no whole answer within 0.3 s \(MediaLimits.fetch_"):
            load_image(f"{server}{path}", quick)
        assert time.monotonic() - start < 1.5


def test_nothing_past_the_cap_and_one_byte_is_read(monkeypatch):
    """The body is read as it comes, and no more of it than max bytes + 1."""
    class Endless:
        status, reason, headers = 200, "OK", {}
        taken = 0

        def read1(self, n):
            Endless.taken += n
            return b"z" * n

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(sources.urllib.request, "urlopen", lambda request, timeout: Endless())
    with pytest.raises(MediaError, match="more bytes than the limit of 100,000"):
        sources.fetch("http://example.invalid/x", "image", "'x'", 100_000, 5.0)
    assert Endless.taken == 100_001


def test_a_server_that_is_not_there(server):
    port = int(server.rsplit(":", 1)[1])
    with pytest.raises(MediaError, match=r"cannot be fetched \(.*refused"):
        load_image(f"http://127.0.0.1:{(port + 1) % 65536 or 1}/x.png", ON)


def test_file_urls_are_local_paths(tmp_path):
    (tmp_path / "a b.png").write_bytes(PNG)
    url = (tmp_path / "a b.png").as_uri()  # file:///.../a%20b.png
    assert load_image(url).size == (40, 30)
    with pytest.raises(MediaError, match=r"a file URL of host 'example.com'; only this machine's files"):
        load_image("file://example.com/a.png")


@pytest.mark.parametrize("bad", [dict(fetch_timeout_s=0), dict(fetch_timeout_s=float("inf")),
                                 dict(allow_remote="yes")])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError, match=rf"\[media\] {next(iter(bad))}="):
        MediaLimits(**bad)
