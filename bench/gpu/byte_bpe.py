"""A synthetic byte-level BPE tokenizer of a chosen size, for benches whose models are
built at run time (random weights) but need a tokenizer of a real vocabulary's size: the
GPU machine has no network and no 128k tokenizer of its own.

    write_byte_bpe(path, regular=128000, special=256)   # Llama 3's layout: 128,256 ids

The tokenizer is the kind Llama 3, Qwen and GPT-2 use (tokenizers' BPE over the
ByteLevel alphabet, every byte a token, so any text encodes), with `regular` tokens: the
256 bytes, then merges of two earlier tokens drawn so the tokens look like English text's
(letters by their frequency, a leading space on about half, some digits and
punctuation), up to 16 characters. Then `special` added tokens at the ids Llama 3 uses
(<|begin_of_text|> 128000, <|end_of_text|> 128001, <|start_header_id|> 128006,
<|end_header_id|> 128007, <|eom_id|> 128008, <|eot_id|> 128009), and a chat template in
their format. Deterministic for a seed.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

NAMED_SPECIALS = {0: "<|begin_of_text|>", 1: "<|end_of_text|>", 6: "<|start_header_id|>",
                  7: "<|end_header_id|>", 8: "<|eom_id|>", 9: "<|eot_id|>"}
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
# English letter frequencies (per cent), then the other characters' weights
LETTERS = dict(zip("etaoinshrdlcumwfgypbvkjxqz",
                   [12.7, 9.1, 8.2, 7.5, 7.0, 6.7, 6.3, 6.1, 6.0, 4.3, 4.0, 2.8, 2.8, 2.4, 2.4, 2.2, 2.0,
                    2.0, 1.9, 1.5, 1.0, 0.8, 0.15, 0.15, 0.1, 0.07]))


def _byte_alphabet() -> list[str]:
    """The ByteLevel pre-tokenizer's printable stand-in of each byte, in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return [chars[b] for b in range(256)]


def _merges(regular: int, seed: int) -> tuple[list[str], list[tuple[str, str]]]:
    alphabet = _byte_alphabet()
    space = alphabet[ord(" ")]
    rng = np.random.default_rng(seed)
    weight = np.full(256, 0.01)
    for c, w in LETTERS.items():
        weight[ord(c)] = w
        weight[ord(c.upper())] = w / 8
    for c in "0123456789":
        weight[ord(c)] = 0.5
    for c in ".,;:!?'\"()-_/{}[]<>=+*&%$#@\n\t":
        weight[ord(c)] = 0.3
    weight[ord(" ")] = 0.0  # spaces lead tokens (below), as in GPT-2-style vocabularies
    weight /= weight.sum()
    vocab = list(alphabet)
    seen = set(vocab)
    merges: list[tuple[str, str]] = []
    while len(vocab) < regular:
        n = int(rng.integers(2, 9))
        word = "".join(alphabet[i] for i in rng.choice(256, size=n, p=weight))
        if rng.random() < 0.5:
            word = space + word
        # build the word left to right from tokens that exist: each step is a merge
        left = word[0]
        for ch in word[1:]:
            right = ch
            new = left + right
            if new not in seen:
                if len(vocab) >= regular:
                    break
                seen.add(new)
                vocab.append(new)
                merges.append((left, right))
            left = new
    return vocab, merges


def write_byte_bpe(path: str | Path, *, regular: int = 128000, special: int = 256, seed: int = 0) -> Path:
    """Writes tokenizer.json and tokenizer_config.json under path (the module doc)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    vocab, merges = _merges(regular, seed)
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(vocab)}, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    names = [NAMED_SPECIALS.get(i, f"<|reserved_special_token_{i}|>") for i in range(special)]
    tok.add_special_tokens([AddedToken(n, special=True, normalized=False) for n in names])
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": NAMED_SPECIALS[0], "eos_token": NAMED_SPECIALS[9], "chat_template": CHAT_TEMPLATE}))
    return path
