"""How a call's prompt becomes the ids it feeds (Engine's part that reads prompts): text or
ids as they are, a chat turn rendered with the model's template and cut to what follows the
cache's common prefix, a conversation with images keyed and run through its tower
(multimodal.py). A mixin of Engine: it reads the engine's tokenizer, chat template and media.
"""
from __future__ import annotations


import numpy as np

from .errors import ArgumentError, argument_error
from .messages import Conversation, normalize as normalize_messages
from .multimodal import MediaPrompt, media_in


class Turns:
    @staticmethod
    def _ids(token_ids) -> np.ndarray:
        """A 1-D int64 array; the C++ engine checks every id against the vocabulary."""
        ids = np.asarray(token_ids)
        if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
            raise ArgumentError(f"[engine] token ids must be a 1-D sequence of ints, got shape {ids.shape} "
                                f"dtype {ids.dtype}")
        return ids.astype(np.int64)

    def _turn(self, prompt, chat: bool, system: str | None, cache) -> tuple[np.ndarray, int | None, list | None]:
        """(ids to feed, tokens of the cache to keep (None: all), the chat messages
        the cache will render, None when not a chat)."""
        if isinstance(prompt, Conversation):
            return self._chat_turn(prompt.messages, cache, prompt.media)
        if isinstance(prompt, MediaPrompt):
            return prompt, None, None
        if not isinstance(prompt, str):
            return self._ids(prompt), None, None
        if not chat:
            return self._ids(self.tokenizer.encode(prompt, add_special=not list(cache.tokens))), None, None
        messages = list(cache.messages)
        if media_in(messages):
            raise ArgumentError("[generate] the cache holds a conversation with images; continue it with "
                                "Engine.chat(messages, cache=...), giving every message with its images")
        if system is not None:
            if not isinstance(system, str):
                raise argument_error("generate", "system", system, "a str (the system prompt) or None")
            messages = [m for m in messages if m["role"] != "system"]
            messages.insert(0, {"role": "system", "content": system})
        messages.append({"role": "user", "content": prompt})
        return self._chat_turn(messages, cache)

    def _chat_turn(self, messages: list, cache, media: list = ()) -> tuple[np.ndarray | MediaPrompt, int, list]:
        """The turn that makes `cache` hold `messages` (and `media`, their images' sources) and
        the reply to come."""
        held = list(cache.tokens)
        if cache.length(0) > len(held):
            raise ArgumentError(f"[generate] the cache holds {cache.length(0)} tokens that no Engine fed; pass a "
                                f"new cache for a chat")
        keyed = self.media.chat_prompt(self, messages, media) if media else None
        ids = keyed.ids.tolist() if media else self._template_ids(messages)
        # Feed only what follows the longest common prefix with the cache; the C++
        # engine rolls the rest back (re-tokenized replies can differ from the sampled ids).
        common = 0
        for a, b in zip(held, ids):
            if a != b:
                break
            common += 1
        common = min(common, len(ids) - 1)  # at least one token to feed
        if common < len(held) and not cache.messages:
            raise ArgumentError(f"[generate] the cache holds {len(held)} tokens that are not a chat this engine "
                                f"rendered; continue it with chat=False or token ids, or pass a new cache")
        # (the towers run here, for the media past the common prefix only)
        return keyed.tail(common) if media else np.asarray(ids[common:], np.int64), common, messages

    def _conversation(self, messages) -> Conversation:
        return Conversation(messages, media=self.media.kinds if self.media else False)

    def chat_ids(self, messages, tools: list | None = None) -> list[int] | MediaPrompt:
        """The prompt ids of `messages` (checked as Engine.chat takes them) under the
        model's chat template, ready for the assistant's reply: with images, a MediaPrompt
        (the ids with their soft tokens). tools: OpenAI's tool list, given to a template that
        takes tools, with the conversation's tool turns."""
        if tools is None:
            conv = self._conversation(messages)
            return self.media.chat_prompt(self, conv.messages, conv.media).tail(0) if conv.media else \
                self._template_ids(conv.messages)
        return self.tokenizer.encode(self.chat_template.render(normalize_messages(messages, tool_turns=True), tools=tools))

    def _template_ids(self, messages: list) -> list[int]:
        """chat_ids of messages already checked (normalize_messages, or this engine's own turns)."""
        return self.tokenizer.encode(self.chat_template.render(messages, add_generation_prompt=True))
