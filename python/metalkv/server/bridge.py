"""The engine's calls, read from an asyncio loop.

Every call the server starts shares one Channel; a pump thread waits on it (the
GIL released) and, when the engine made progress, has the loop read each live
call's new pieces (Call.pieces) into its Run and wake whoever awaits that Run.
So one thread, not one per client, watches the engine, and every piece of text
is made on the loop thread that sends it.
"""
from __future__ import annotations

import asyncio
import threading

from .. import _core
from .._calls import Call

PUMP_WAIT_SECONDS = 0.05  # how often the pump looks for a stop request while the engine is idle


class Overloaded(Exception):
    """More calls than the server takes at once."""


class Run:
    """One request's calls, as the loop sees them: new text per call, then the end."""

    def __init__(self, calls: list[Call]):
        self.calls = calls
        self.pending: list[list[str]] = [[] for _ in calls]  # pieces not yet handed out, per call
        self.finished = [False] * len(calls)
        self.reported = [False] * len(calls)  # its end handed out
        self.abandoned = False  # cancelled for a client that has gone: nobody takes its pieces
        self.errors: list[Exception | None] = [None] * len(calls)  # a call whose text could not be made
        self.changed = asyncio.Event()

    @property
    def done(self) -> bool:
        return all(self.finished)

    def poll(self) -> None:
        for i, call in enumerate(self.calls):
            if self.finished[i]:
                continue
            try:
                out, done = call.pieces()
            except Exception as e:  # noqa: BLE001 - this reply fails (a 500), the others go on
                call.request.abort()
                out, done, self.errors[i] = [], True, e
            if out or done:
                self.pending[i].extend(out)
                self.finished[i] = done
                self.changed.set()

    def take(self) -> list[tuple[int, str, bool]]:
        """(call index, text since the last take, whether that call is over) for each call
        that made progress."""
        self.changed.clear()
        got = []
        for i, pieces in enumerate(self.pending):
            if pieces or (self.finished[i] and not self.reported[i]):
                got.append((i, "".join(pieces), self.finished[i]))
                self.pending[i] = []
                self.reported[i] = self.finished[i]
        return got

    def cancel(self) -> None:
        """The client has gone: stop each call before its next step (its blocks go back)."""
        self.abandoned = True
        for i, call in enumerate(self.calls):
            if not self.finished[i]:
                call.request.cancel()


class Bridge:
    """Starts calls on the engine and delivers their progress to the loop."""

    def __init__(self, engine, max_calls: int, on_end=None):
        self.engine = engine
        self.on_end = on_end  # called with each call as it ends (the server's metrics and prefix store)
        self.max_calls = max_calls  # calls started and not over, beyond which new requests are refused
        self.channel = _core.Channel()
        self.runs: set[Run] = set()
        self.cancelled = 0  # calls cancelled because their client went away or the server stopped
        self.max_batch = 0  # the most sequences a finished call shared a step with
        self.loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._scheduled = False
        self._thread: threading.Thread | None = None

    @property
    def calls_in_flight(self) -> int:
        return sum(len(r.calls) - sum(r.finished) for r in self.runs)

    def open(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._pump, name="metalkv-pump", daemon=True)
        self._thread.start()

    def start(self, specs: list[dict]) -> Run:
        """A Run of one call per spec (Engine.start's keyword arguments); refuses with
        Overloaded when the server has max_calls in flight."""
        if self.calls_in_flight + len(specs) > self.max_calls:
            raise Overloaded()
        calls: list[Call] = []
        try:
            for spec in specs:
                calls.append(self.engine.start(channel=self.channel, **spec))
        except BaseException:
            for c in calls:
                c.request.abort()
            raise
        run = Run(calls)
        self.runs.add(run)
        self._deliver()  # a call may be over already (max_tokens reached in its prefill)
        return run

    async def wait(self, run: Run) -> list[tuple[int, str, bool]]:
        """The next progress of `run` (waits for some)."""
        while True:
            got = run.take()
            if got:
                if all(run.reported):
                    self.runs.discard(run)
                    self.max_batch = max([self.max_batch] + [int(c.request.stats["max_batch"]) for c in run.calls])
                return got
            await run.changed.wait()

    def _pump(self) -> None:
        while not self._stop.is_set():
            self.channel.wait(PUMP_WAIT_SECONDS)
            if self.runs and not self._scheduled:
                self._scheduled = True
                try:
                    self.loop.call_soon_threadsafe(self._deliver)
                except RuntimeError:  # the loop has closed
                    return

    def _deliver(self) -> None:
        self._scheduled = False
        for run in list(self.runs):
            was = list(run.finished)
            run.poll()
            if self.on_end is not None:
                for i, call in enumerate(run.calls):
                    if run.finished[i] and not was[i]:
                        self.on_end(call)
            if run.abandoned and run.done:
                self.runs.discard(run)
                self.cancelled += sum(c.request.finish_reason == "cancelled" for c in run.calls)

    def cut_short(self) -> None:
        """The shutdown's grace is over: every call still running stops before its next
        step, and its reply ends with the shutdown's error (Server.check_ended): a JSON
        error, or a stream's error event and then [DONE]. Its client still reads it."""
        for run in list(self.runs):
            for i, call in enumerate(run.calls):
                if not run.finished[i]:
                    call.request.cancel()
                    self.cancelled += not run.abandoned  # (an abandoned run's are counted when they end)

    async def close(self, timeout: float = 10.0) -> None:
        """Cancels every call still running, waits (up to `timeout`) for the engine to end
        them, then stops the pump."""
        for run in list(self.runs):
            run.cancel()
        deadline = self.loop.time() + timeout
        while any(not r.done for r in self.runs) and self.loop.time() < deadline:
            self._deliver()
            await asyncio.sleep(0.02)
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=1.0)
