"""metalkv's OpenAI-compatible server (`metalkv serve`, docs/SERVER.md).

    import metalkv
    from metalkv.server import serve
    serve(metalkv.Engine.load(), port=8080)   # then point any OpenAI client at http://127.0.0.1:8080/v1

Requests run on the engine's scheduler, batched into shared steps with every other
request in flight; a prompt that starts like an earlier one takes its cached blocks.
Needs the `server` extra: pip install 'metalkv[server]'.
"""
from __future__ import annotations

from .app import create_app
from .protocol import ApiError

__all__ = ["ApiError", "create_app", "serve"]


def serve(engine, *, host: str = "127.0.0.1", port: int = 8080, shutdown_timeout: float = 10.0,
          log_level: str = "info", **options) -> None:
    """Serves `engine` until SIGINT or SIGTERM: then new connections are refused, replies in
    flight have shutdown_timeout seconds to finish, and what is left is cancelled.
    options: create_app's (model_name, api_key, max_calls, defaults, max_tokens)."""
    import signal
    import threading

    import uvicorn

    app = create_app(engine, **options)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=shutdown_timeout)
    # uvicorn sends the signal that stopped it on to the handler it found: with Python's
    # defaults, SIGINT would end a clean shutdown as a KeyboardInterrupt and SIGTERM would
    # kill the process. Asked to stop and stopped cleanly is a normal exit.
    main = threading.current_thread() is threading.main_thread()
    before = {s: signal.signal(s, lambda *_: None) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        uvicorn.Server(config).run()
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
