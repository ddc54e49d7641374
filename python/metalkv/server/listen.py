"""The listening side of `metalkv serve`: the socket, bound before the model loads, and
uvicorn's server with a shutdown that ends every reply in words the client reads."""
from __future__ import annotations

import asyncio
import errno
import socket

import uvicorn

CUT_SHORT_SECONDS = 5.0  # past the grace, how long cut replies have to end before uvicorn cancels them


class AddressError(ValueError):
    """The address cannot be listened on (a busy port, an address not of this machine):
    a ValueError, so `metalkv serve` prints its one line and exits 2, as for a flag."""


def bind(host: str = "127.0.0.1", port: int = 8080) -> socket.socket:
    """A socket bound to host:port, for serve(sock=...). `metalkv serve` binds before the
    model loads, so a busy port is said at once rather than after the load."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    # A previous server's TIME_WAIT connections need not block a restart; a socket still
    # listening on the port does (the bind fails either way).
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise AddressError(f"port {port} on {host} is already in use (another server is listening there): "
                               f"choose another with --port") from None
        if e.errno == errno.EACCES:
            raise AddressError(f"port {port} on {host}: permission denied (ports below 1024 need privileges): "
                               f"choose another with --port") from None
        raise AddressError(f"cannot listen on {host}:{port} ({e.strerror or e}): check --host") from None
    return sock


class GracefulServer(uvicorn.Server):
    """uvicorn's server, which cuts the replies still running short itself once the
    shutdown's grace is over (on_grace_over: Bridge.cut_short), so that each ends with its
    error, a stream's with [DONE]. uvicorn's own cancellation, CUT_SHORT_SECONDS later, is
    only a backstop: a request it cancels gets no ending at all, and uvicorn logs "ASGI
    callable returned without completing response"."""

    def __init__(self, config: uvicorn.Config, *, grace: float, on_grace_over, ready=None):
        super().__init__(config)
        self.grace, self.on_grace_over, self.ready = grace, on_grace_over, ready

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets=sockets)
        if self.started and self.ready:  # listening now (given sockets, uvicorn does not say where)
            self.ready()

    async def shutdown(self, sockets=None) -> None:
        timer = asyncio.get_running_loop().call_later(self.grace, self.on_grace_over)
        try:
            await super().shutdown(sockets=sockets)
        finally:
            timer.cancel()
