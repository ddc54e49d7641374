"""The server's prefix store (metalkv.prefix_store) off the request path: warm() runs
in a worker thread before a request's calls start (the event loop goes on), save() in
one background thread after a call ends, a prompt at a time, so a reply never waits for
a disk write. Prompts shorter than MIN_TOKENS (two blocks and the two tokens a call
feeds) are not saved: they cost more to look up than to compute."""
from __future__ import annotations

import queue
import sys
import threading

MIN_TOKENS = 2 * 32 + 2


class StoreWorker:
    def __init__(self, store):
        self.store = store
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="metalkv-prefix-store", daemon=True)
        self._thread.start()

    def warm(self, ids) -> int:
        return self.store.warm(ids) if len(ids) >= MIN_TOKENS else 0

    def save(self, ids) -> None:
        if ids is not None and len(ids) >= MIN_TOKENS:
            self._queue.put(list(ids))

    def _run(self) -> None:
        while True:
            ids = self._queue.get()
            try:
                if ids is None:
                    return
                self.store.save(ids)
            except Exception as e:  # noqa: BLE001 - a failed save costs a later recompute, never a request
                self.store.stats["save_failed"] += 1
                print(f"metalkv serve: warning: the prefix store could not save a prompt: {e}", file=sys.stderr)
            finally:
                self._queue.task_done()

    def flush(self) -> None:
        """Waits until every save queued so far is done (tests, a bench)."""
        self._queue.join()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30)
