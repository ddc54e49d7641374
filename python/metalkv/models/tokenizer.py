"""Tokenizer: the PyPI `tokenizers` package, built either from a GGUF file's
vocabulary (byte-level BPE or SentencePiece, split the way llama.cpp splits it:
gguf_vocab.py) or from an HF directory's tokenizer.json. Plus an incremental detokenizer for
streaming, which only ever emits complete UTF-8 text.

Special tokens follow llama.cpp: CONTROL tokens (<|im_start|>, ...) are only
recognised in text when parse_special is on; USER_DEFINED ones always are.
BOS/EOS follow transformers: a plain prompt gets what the model's tokenizer adds
(tokenizer(text)), a rendered chat prompt (ChatPrompt) none beyond what its
template wrote (apply_chat_template). docs/MODELS.md, "BOS and EOS".
"""
from __future__ import annotations

import json
import pathlib
from typing import Any, Iterable, Mapping

from . import gguf_vocab
from .chat import ChatPrompt
from .errors import ModelLoadError

class Tokenizer:
    """encode/decode text <-> token ids for one model."""

    def __init__(self, tok, *, bos_id: int | None, eos_ids: Iterable[int], add_bos: bool,
                 add_eos: bool = False, control_ids: Iterable[int] = ()):
        self._tok = tok
        self.bos_id = bos_id
        self.eos_ids = tuple(eos_ids)
        self.add_bos = add_bos
        self.add_eos = add_eos
        self.control_ids = frozenset(control_ids)  # left out of decode(skip_special=True)

    # -- construction ---------------------------------------------------------------
    @classmethod
    def from_gguf_metadata(cls, md: Mapping[str, Any], *, eos_ids: Iterable[int] = ()) -> "Tokenizer":
        """The file's own vocabulary, split as llama.cpp splits it (gguf_vocab.py)."""
        tok, add_bos = gguf_vocab.build(md)
        types = md.get("tokenizer.ggml.token_type") or []
        control = [i for i, t in enumerate(types) if t == gguf_vocab.CONTROL]
        return cls(tok, bos_id=md.get("tokenizer.ggml.bos_token_id"), eos_ids=eos_ids,
                   add_bos=bool(md.get("tokenizer.ggml.add_bos_token", add_bos)),
                   add_eos=bool(md.get("tokenizer.ggml.add_eos_token", False)), control_ids=control)

    @classmethod
    def from_hf_dir(cls, path: str | pathlib.Path, *, bos_id: int | None = None,
                    eos_ids: Iterable[int] = ()) -> "Tokenizer":
        """tokenizer.json as written by transformers. BOS/EOS insertion (add_special=True)
        is its post-processor's, as in transformers (5.24), which leaves tokenizer_config.json's
        add_bos_token unused when tokenizer.json has a post-processor."""
        from tokenizers import Tokenizer as HFTokenizer

        f = pathlib.Path(path) / "tokenizer.json"
        if not f.is_file():
            raise ModelLoadError(f"[tokenizer] {path}: no tokenizer.json")
        try:
            tok = HFTokenizer.from_file(str(f))
            added = json.loads(f.read_text(encoding="utf-8")).get("added_tokens", [])
        except Exception as e:
            raise ModelLoadError(f"[tokenizer] {f}: cannot read ({e})") from e
        control = [t["id"] for t in added if t.get("special")]
        return cls(tok, bos_id=bos_id, eos_ids=eos_ids, add_bos=False, control_ids=control)

    # -- use --------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of text. add_special adds BOS/EOS where the model asks for them
        (SmolLM2 asks for neither), never to a ChatPrompt (its template wrote the ones
        the model wants); parse_special recognises control-token text such as
        "<|im_start|>" as the token itself, as chat prompts need."""
        if not isinstance(text, str):
            raise TypeError(f"[tokenizer] encode expects str, got {type(text).__name__}")
        if isinstance(text, ChatPrompt):
            # A template that writes bos_token plus a tokenizer that adds one gave
            # [bos, bos, ...]; transformers and llama.cpp keep one (see ChatPrompt).
            add_special = False
        self._tok.encode_special_tokens = not parse_special
        try:
            ids = self._tok.encode(text, add_special_tokens=add_special).ids
        finally:
            self._tok.encode_special_tokens = False
        if add_special and self.add_bos and self.bos_id is not None and ids[:1] != [self.bos_id]:
            ids.insert(0, self.bos_id)
        if add_special and self.add_eos and self.eos_ids:
            ids.append(self.eos_ids[0])
        return ids

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"[tokenizer] token id {bad[0]} out of range [0, {self.vocab_size})")
        if skip_special:
            ids = [i for i in ids if i not in self.control_ids]
        return self._tok.decode(ids, skip_special_tokens=False)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, i: int) -> str | None:
        return self._tok.id_to_token(int(i))

    def detokenizer(self, *, skip_special: bool = False) -> "IncrementalDetokenizer":
        return IncrementalDetokenizer(self, skip_special=skip_special)


class IncrementalDetokenizer:
    """Decode a growing list of ids, emitting only text that is complete.

    A byte-level token may end in the middle of a UTF-8 character (emoji, CJK
    split over tokens); decoding then yields U+FFFD, which we hold back until the
    next tokens complete it. Decoding a short window [prefix, end) rather than the
    whole list keeps each step O(window), and starting the window a few tokens
    back keeps decoders that treat the first token specially (SentencePiece's
    leading space) from changing the text already emitted.
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = False):
        self._tok = tokenizer
        self._skip = skip_special
        self._ids: list[int] = []
        self._prefix = 0   # window start
        self._read = 0     # ids up to here have been emitted

    def add(self, token_id: int) -> str:
        """Append one id; returns the newly completed text (may be "")."""
        self._ids.append(int(token_id))
        before = self._tok.decode(self._ids[self._prefix:self._read], skip_special=self._skip)
        after = self._tok.decode(self._ids[self._prefix:], skip_special=self._skip)
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self._ids)
            return after[len(before):]
        return ""

    def flush(self) -> str:
        """Whatever is left at the end of generation, incomplete bytes as U+FFFD."""
        before = self._tok.decode(self._ids[self._prefix:self._read], skip_special=self._skip)
        after = self._tok.decode(self._ids[self._prefix:], skip_special=self._skip)
        self._prefix = self._read = len(self._ids)
        return after[len(before):]
