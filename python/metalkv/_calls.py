"""Calls in flight: the Python side of the engine's requests.

The C++ scheduler runs every call in batched steps on its own thread; here the
calling thread reads each request's ids as they come, turns them into text,
cuts at stop strings (asking the engine to roll back what it fed past the cut)
and hands pieces out. Several calls of one generate(list) share a Channel, so
one wait wakes for whichever made progress. Waits are short, so Ctrl-C on the
main thread is seen between them.
"""
from __future__ import annotations

from typing import Callable, Iterator

import numpy as np

from . import _core

WAIT_SECONDS = 0.1  # between checks for Ctrl-C while the engine runs


class StopMatcher:
    """Cuts generated text at the first stop string. Text that might be the start
    of a stop string is held back until the next pieces decide."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.pending = ""
        self.stopped = False

    def feed(self, piece: str) -> str:
        self.pending += piece
        cut = min((i for i in (self.pending.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            out, self.pending, self.stopped = self.pending[:cut], "", True
            return out
        keep = len(self.pending) - self.hold
        out, self.pending = self.pending[:max(keep, 0)], self.pending[max(keep, 0):]
        return out

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


class Call:
    """One request and what turns its ids into text. done() once the engine is
    finished with it and every piece has been handed out."""

    def __init__(self, request, detokenizer, stops: list[str], on_done: Callable[["Call"], None] | None = None,
                 logprobs: bool = False):
        self.request = request
        self.media_stats: dict = {}  # a prompt with images: its towers' (multimodal.MediaPrompt.stats)
        self.detok = detokenizer
        self.matcher = StopMatcher(stops)
        self.ids: list[int] = []       # every id the engine generated, up to a stop
        self.text: list[str] = []
        # with logprobs: (logprob, [(id, logprob), ...]) of each of self.ids
        self.logprobs: list[tuple[float, list[tuple[int, float]]]] | None = [] if logprobs else None
        self.finished = False
        self.on_done = on_done

    def pieces(self) -> tuple[list[str], bool]:
        """Text pieces since the last call, and whether the call is over."""
        new, done = self.request.take()
        out = []
        had = len(self.ids)
        for token in new:
            if self.matcher.stopped:
                break
            self.ids.append(token)
            if self.detok is None:
                continue
            piece = self.matcher.feed(self.detok.add(token))
            if piece:
                out.append(piece)
            if self.matcher.stopped:  # the engine keeps ids 0..k, the cache as if k were the last
                self.request.stop_after(len(self.ids) - 1)
        if self.logprobs is not None and len(self.ids) > had:  # recorded with the ids, so there already
            self.logprobs.extend(self.request.logprobs(had)[:len(self.ids) - had])
        if done and not self.finished:
            self.finished = True
            if self.detok is not None and not self.matcher.stopped:
                tail = self.matcher.feed(self.detok.flush())  # incomplete bytes, then what was held back
                if not self.matcher.stopped:
                    tail += self.matcher.flush()
                if tail:
                    out.append(tail)
            self.text.extend(out)
            if self.on_done:
                self.on_done(self)
            return out, True
        self.text.extend(out)
        return out, False

    def stats(self) -> dict:
        st = dict(self.request.stats)
        st["finish_reason"] = "stop_string" if self.matcher.stopped else self.request.finish_reason
        return st


def drive(calls: list[Call], channel, *, on_interrupt: str,
          progress: Callable[[int, int], None] | None = None) -> Iterator[tuple[int, str]]:
    """(index, piece) as the calls produce them, until every call is over; then
    raises the first call's error, if one failed. If the consumer stops early or
    an exception (Ctrl-C) arrives, the calls still running are cancelled
    (on_interrupt='cancel': they keep what they generated) or aborted ('abort':
    their caches go back to what they held before), and waited for.
    progress(done, total): the prompt tokens read so far and in all (the calls'
    together), called each time they change."""
    pending = set(range(len(calls)))
    shown = (0, 0)
    try:
        while pending:
            channel.wait(WAIT_SECONDS)
            if progress is not None:
                now = tuple(map(sum, zip(*(c.request.prompt_progress for c in calls))))
                if now != shown and now[1]:
                    shown = now
                    progress(*now)
            for i in sorted(pending):
                out, done = calls[i].pieces()
                for piece in out:
                    yield i, piece
                if done:
                    pending.discard(i)
    finally:
        if pending:
            for i in pending:
                getattr(calls[i].request, on_interrupt)()
            for i in pending:
                _wait(calls[i])
    for c in calls:
        c.request.result()  # raises a failed call's error


def _wait(call: Call) -> None:
    """Waits (GIL released) until the engine is done with the call; its error is not raised here."""
    try:
        call.request.result()
    except Exception:  # noqa: BLE001 - the caller is already leaving with its own exception
        pass
    call.pieces()


def request_stats(raw: dict) -> dict:
    """A request's stats (Call.stats()) with rates and per-token counts."""
    st = dict(raw)
    p = st["prompt_tokens"]
    st["prefill_tok_s"] = p / st["prefill_seconds"] if st["prefill_seconds"] else 0.0
    # a decode step samples one id, and one more per accepted proposal (speculative
    # decoding); the first generated token came with the prefill
    steps = st["decode_steps"]
    decoded = steps + st["draft_accepted"]
    st["decode_tok_s"] = decoded / st["decode_seconds"] if steps and st["decode_seconds"] else 0.0
    st["draft_acceptance"] = st["draft_accepted"] / st["draft_proposed"] if st["draft_proposed"] else 0.0
    for k in ("dispatches", "compute_encoders", "blit_encoders", "command_buffers_committed", "waits"):
        st[f"{k}_per_token"] = st.get(f"decode_{k}", 0) / steps if steps else 0.0
    for k in ("prompt_tokens", "prompt_tokens_cached", "generated_tokens", "prefill_steps", "decode_steps",
              "max_batch", "draft_proposed", "draft_accepted"):
        st[k] = int(st[k])
    return st


def call_stats(calls: list[Call], many: bool) -> dict:
    """One call's stats, or for a list: totals, the largest batch, and each request's."""
    each = [{**request_stats(c.stats()), **c.media_stats} for c in calls]
    if not many:
        return each[0]
    total = {k: sum(st[k] for st in each) for k in ("prompt_tokens", "prompt_tokens_cached", "generated_tokens")}
    total["max_batch"] = max(st["max_batch"] for st in each)
    total["requests"] = each
    return total


def is_prompt_list(prompts) -> bool:
    """A list (or tuple) of prompts: of str, or of token-id sequences."""
    if isinstance(prompts, (str, bytes, np.ndarray)) or not isinstance(prompts, (list, tuple)):
        return False
    return len(prompts) == 0 or all(isinstance(p, str) or (isinstance(p, (list, tuple, np.ndarray)) and
                                                            not isinstance(p, str)) for p in prompts)
