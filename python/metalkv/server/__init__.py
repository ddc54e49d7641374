"""metalkv's OpenAI-compatible server (`metalkv serve`, docs/SERVER.md).

    import metalkv
    from metalkv.server import serve
    serve(metalkv.Engine.load(), port=8080)   # then point any OpenAI client at http://127.0.0.1:8080/v1

Requests run on the engine's scheduler, batched into shared steps with every other
request in flight; a prompt that starts like an earlier one takes its cached blocks.
Needs the `server` extra: pip install 'metalkv[server]'.
"""
from __future__ import annotations

import socket

from .app import create_app
from .listen import CUT_SHORT_SECONDS, AddressError, GracefulServer, bind
from .protocol import ApiError

__all__ = ["AddressError", "ApiError", "bind", "create_app", "serve"]


def serve(engine, *, host: str = "127.0.0.1", port: int = 8080, sock: socket.socket | None = None,
          ready=None, shutdown_timeout: float = 10.0, log_level: str = "info", **options) -> None:
    """Serves `engine` until SIGINT or SIGTERM: then new connections are refused, replies in
    flight have shutdown_timeout seconds to finish, and what is left is cut short: each
    such reply ends with an error (a 503 JSON error; a stream's error event, then [DONE]).
    sock: a socket from bind(host, port) (else serve binds it; AddressError if it cannot).
    ready(url): called once the server listens (`metalkv serve` prints its URL then).
    options: create_app's (model_name, api_key, max_calls, defaults, max_tokens)."""
    import signal
    import threading

    import uvicorn

    sock = sock or bind(host, port)
    app = create_app(engine, **options)
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=shutdown_timeout + CUT_SHORT_SECONDS)
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
    server = GracefulServer(config, grace=shutdown_timeout, on_grace_over=app.state.server.bridge.cut_short,
                            ready=(lambda: ready(url)) if ready else None)
    # uvicorn sends the signal that stopped it on to the handler it found: with Python's
    # defaults, SIGINT would end a clean shutdown as a KeyboardInterrupt and SIGTERM would
    # kill the process. Asked to stop and stopped cleanly is a normal exit.
    main = threading.current_thread() is threading.main_thread()
    before = {s: signal.signal(s, lambda *_: None) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        for s, handler in before.items():
            signal.signal(s, handler)
