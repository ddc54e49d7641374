"""A GGUF file's vocabulary as a `tokenizers` Tokenizer that splits text the way
llama.cpp does (llama-vocab.cpp), for its two common tokenizer models:

  "gpt2"   byte-level BPE over the file's merges, after the regex steps its
           tokenizer.ggml.pre names (_PRE); "ignore_merges" pre-tokenizers emit a
           piece that is a whole token as that token.
  "llama"  SentencePiece (Llama 2, Mistral, Phi-3, Gemma): the highest-scoring pair
           of adjacent pieces merges first, characters outside the vocabulary
           become <0xXX> byte tokens, spaces are "▁", and one "▁" starts the text
           and every piece of text after a special token (add_space_prefix). Built as
           a BPE model whose merge ranks are the tokens' scores, with no pre-split:
           llama.cpp runs SentencePiece over the whole text between special tokens.

CONTROL and UNKNOWN tokens are matched in text only with parse_special (encode's
switch), USER_DEFINED ones always, before any other splitting. Checked against
llama.cpp's own vocabulary tests by tools/check_llamacpp_vocabs.py; docs/MODELS.md,
"GGUF vocabularies".
"""
from __future__ import annotations

from typing import Any, Mapping

from .errors import ModelLoadError

# GGUF token types (gguf.TokenType)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"  # SentencePiece's "▁", a space inside a piece

# ---- BPE pre-tokenizers: tokenizer.ggml.pre -> llama.cpp's regex steps ------------------
# Each step splits the pieces the one before left (text no step matches stays a piece of
# its own): tokenizers' Split(..., "isolated") in sequence. "digits": each \p{N} alone.
_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
_QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_SEED_CODER = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_UPPER, _LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"


def _cased_words(numbers: str, suffix: str) -> str:
    """Tekken's and GPT-4o's split: words by case runs, then numbers, punctuation, spaces."""
    return (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{suffix}|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{suffix}"
            rf"|{numbers}| ?[^\s\p{{L}}\p{{N}}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


_TEKKEN = _cased_words(r"\p{N}", "")
_GPT4O = _cased_words(r"\p{N}{1,3}", _CONTRACTIONS + "?")
# Ranges as code points (\x{...}): Latin, Greek, Cyrillic and other cased scripts; full-width
# and CJK punctuation; CJK, Hangul and kana blocks.
_DS_LATIN = (r"\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}"
             r"\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}"
             r"\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}"
             r"\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}"
             r"\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}"
             r"\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}"
             r"\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}"
             r"\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}"
             r"\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}"
             r"\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}"
             r"\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}"
             r"\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}"
             r"\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}"
             r"\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+")
_DS_PUNCT = r"\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+"
_DS_CJK = r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+"
_DEEPSEEK_LLM = (r"[\r\n]", _DS_LATIN, _DS_PUNCT, r"\s+$", _DS_CJK, r"\p{N}+")
_DEEPSEEK_CODER = (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _DS_CJK, r"\p{N}")
_DEEPSEEK_V3 = (r"\p{N}{1,3}", r"[\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+",
                r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
                r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_PORO = r" ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{964}\x{6D4}\x{60C})]+"


def _group(names: str, steps: tuple, *, ignore_merges: bool = False, add_bos: bool = False) -> dict:
    return {n: (steps, ignore_merges, add_bos) for n in names.split()}


# name -> (steps, ignore_merges, add_bos when the file has no tokenizer.ggml.add_bos_token),
# llama.cpp's llama_vocab::impl::load and llm_tokenizer_bpe.
_PRE: dict[str, tuple[tuple, bool, bool]] = {
    **_group("default", (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")),
    **_group("llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2", (_LLAMA3,),
             ignore_merges=True, add_bos=True),
    **_group("dbrx smaug-bpe chatglm-bpe", (_LLAMA3,)),
    **_group("glm4 glm5", (_LLAMA3,), ignore_merges=True),
    **_group("qwen2 deepseek-r1-qwen kormo megrez stablelm2 hunyuan", (_QWEN2,)),
    **_group("qwen35", (_QWEN35,)),
    **_group("gpt-2 gpt2 phi-2 mpt olmo jais trillion exaone4 mellum modern-bert", (_GPT2,)),
    **_group("starcoder refact command-r smollm codeshell exaone minerva-7b", ("digits", _GPT2)),
    **_group("falcon", (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]")),
    **_group("deepseek-llm", _DEEPSEEK_LLM),
    **_group("deepseek-coder", _DEEPSEEK_CODER),
    **_group("deepseek-v3 hunyuan-dense", _DEEPSEEK_V3),
    **_group("tekken", (_TEKKEN,), ignore_merges=True, add_bos=True),
    **_group("gpt-4o llama4 minimax-m2", (_GPT4O,)),
    **_group("seed-coder", (_SEED_CODER,)),
    **_group("poro-chat bloom gpt3-finnish", (_PORO,)),
    **_group("viking", (_PORO, "digits")),
}


def _pre_tokenizer(steps: tuple):
    from tokenizers import Regex, pre_tokenizers as pt

    split = [pt.Digits(individual_digits=True) if s == "digits" else pt.Split(Regex(s), behavior="isolated")
             for s in steps]
    return pt.Sequence(split + [pt.ByteLevel(add_prefix_space=False, use_regex=False)])


# ---- the tokenizer ------------------------------------------------------------------------

def build(md: Mapping[str, Any]) -> tuple[Any, bool]:
    """(a tokenizers.Tokenizer, add_bos when the file does not say) for a GGUF's metadata,
    already checked by gguf_loader.check_vocab_metadata."""
    kind = md.get("tokenizer.ggml.model")
    tokens: list[str] = md["tokenizer.ggml.tokens"]
    types: list[int] = md.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    if kind == "gpt2":
        tok, add_bos = _byte_level_bpe(md, tokens)
    elif kind == "llama":
        tok, add_bos = _sentencepiece(md, tokens, types), True
    else:
        raise ModelLoadError(f"[tokenizer] GGUF tokenizer model {kind!r} is not supported; 'gpt2' "
                             f"(byte-level BPE) and 'llama' (SentencePiece) are")
    tok.add_tokens(_added_tokens(md, tokens, types))
    return tok, add_bos


def _byte_level_bpe(md: Mapping[str, Any], tokens: list[str]):
    from tokenizers import Tokenizer, decoders, models

    pre = md.get("tokenizer.ggml.pre", "default")
    if pre not in _PRE:
        raise ModelLoadError(f"[tokenizer] GGUF pre-tokenizer {pre!r} is not supported "
                             f"(supported: {', '.join(sorted(_PRE))})")
    steps, ignore_merges, add_bos = _PRE[pre]
    merges = [tuple(m.split(" ", 1)) for m in md.get("tokenizer.ggml.merges", [])]
    vocab = {t: i for i, t in enumerate(tokens)}  # unique: gguf_loader checked the token list
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, ignore_merges=ignore_merges))
    tok.pre_tokenizer = _pre_tokenizer(steps)
    tok.decoder = decoders.ByteLevel()
    return tok, add_bos


def _sentencepiece(md: Mapping[str, Any], tokens: list[str], types: list[int]):
    from tokenizers import Tokenizer, decoders, models, normalizers

    scores: list[float] = md.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
    vocab = {t: i for i, t in enumerate(tokens)}
    unk = md.get("tokenizer.ggml.unknown_token_id", 0)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=_score_merges(tokens, types, scores), byte_fallback=True,
                               fuse_unk=True, unk_token=tokens[unk] if 0 <= unk < len(tokens) else None))
    prefix = bool(md.get("tokenizer.ggml.add_space_prefix", True))
    tok.normalizer = normalizers.Sequence(([normalizers.Prepend(SPACE)] if prefix else [])
                                          + [normalizers.Replace(" ", SPACE)])
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
                                    + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    return tok


def _score_merges(tokens: list[str], types: list[int], scores: list[float]) -> list[tuple[str, str]]:
    """SentencePiece as BPE: every split of a token into two tokens is a merge, ranked by the
    token's score, highest first (llama.cpp merges the best-scoring adjacent pair first).
    Byte and unused tokens take no part; equal scores keep the vocabulary's order."""
    merges: list[tuple[float, int, str, str]] = []
    vocab = {t: i for i, t in enumerate(tokens) if types[i] not in (BYTE, UNUSED)}
    for piece, i in vocab.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                merges.append((-scores[i], i, left, right))
    merges.sort()
    return [(left, right) for _, _, left, right in merges]


def _added_tokens(md: Mapping[str, Any], tokens: list[str], types: list[int]) -> list:
    """CONTROL and UNKNOWN tokens as special ones (matched only with parse_special), USER_DEFINED
    as plain added tokens (always matched); neither normalized. Phi-3's special tokens take
    the white space after them, as llama.cpp sets for models whose name says phi-3."""
    from tokenizers import AddedToken

    name = str(md.get("general.name", "")).lower()
    phi3 = "phi-3" in name or "phi3" in name
    keep_space = {"<unk>", "<s>", "<|endoftext|>"}
    return [AddedToken(tokens[i], special=types[i] != USER_DEFINED, normalized=False,
                       rstrip=phi3 and tokens[i] not in keep_space)
            for i in range(len(tokens)) if types[i] in (CONTROL, UNKNOWN, USER_DEFINED)]
