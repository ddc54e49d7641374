"""Tiny checkpoints with a real-shaped tokenizer and chat template for each family
metalkv loads, for comparing prompt ids with transformers (test_chat_bos.py).

Each tokenizer.json has the pipeline transformers (v5) itself builds for the
family's tokenizer class (LlamaTokenizer: Metaspace SentencePiece BPE with byte
fallback; GemmaTokenizer: " " -> "▁" and byte fallback; Qwen2Tokenizer and Llama 3's
PreTrainedTokenizerFast: byte-level BPE behind the family's regex), over a small
vocabulary in the real layout (special tokens where the real files have them, or
at the end). The templates have the real ones' shape around BOS: Llama 3, Mistral
and Gemma write bos_token themselves; Qwen and Phi-3 write none.
"""
from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass, field

from .tiny import gemma3_config, llama_config, write_gguf, write_hf_dir

# llama.cpp's / Qwen2Tokenizer's splits (the same strings as metalkv.models.tokenizer's)
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")

LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% else %}{{ '[INST] ' + message['content'] + '\n\n' }}{% endif %}{% endfor %}")
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")
CHATML_TEMPLATE = (  # Qwen 2.5's shape: a default system turn, no BOS anywhere
    "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a tiny model.<|im_end|>\n' }}{% endif %}"
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
QWEN3_TEMPLATE = (  # Qwen 3's shape: no default system turn, an empty think block on request
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}{% endif %}"
    "{% endif %}")
PHI3_TEMPLATE = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}")

WORDS = "hi you are a tiny model be brief what is two plus three the sum five"  # merged into tokens
LETTERS = "abcdefghijklmnopqrstuvwxyz"


# head_dim 32: the smallest the attention kernels take
SMALL = dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64)
GEMMA_SMALL = dict(SMALL, head_dim=32, query_pre_attn_scalar=32)


@dataclass(frozen=True)
class Family:
    name: str
    config: dict            # config.json, vocab_size filled in by write_checkpoint
    kind: str               # "metaspace" | "gemma" | "byte_level"
    specials: tuple         # special tokens, in id order at the front ("byte_level": at the end)
    bos: str | None
    eos: str
    template: str
    tokenizer_class: str
    regex: str = ""         # byte_level: the split before ByteLevel
    gguf_pre: str = ""      # byte_level: tokenizer.ggml.pre
    extra_config: dict = field(default_factory=dict)  # more tokenizer_config.json keys


FAMILIES = {
    "llama": Family("llama", llama_config(**SMALL), "byte_level",
                    ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                     "<|eot_id|>"), "<|begin_of_text|>", "<|eot_id|>", LLAMA3_TEMPLATE,
                    "PreTrainedTokenizerFast", LLAMA3_REGEX, "llama-bpe"),
    "qwen2": Family("qwen2", llama_config(model_type="qwen2", **SMALL), "byte_level",
                    ("<|endoftext|>", "<|im_start|>", "<|im_end|>"), None, "<|im_end|>", CHATML_TEMPLATE,
                    "Qwen2Tokenizer", QWEN2_REGEX, "qwen2"),
    "qwen3": Family("qwen3", llama_config(model_type="qwen3", head_dim=32, **SMALL), "byte_level",
                    ("<|endoftext|>", "<|im_start|>", "<|im_end|>"), None, "<|im_end|>", QWEN3_TEMPLATE,
                    "Qwen2Tokenizer", QWEN2_REGEX, "qwen2", {"add_bos_token": False}),
    "mistral": Family("mistral", llama_config(model_type="mistral", **SMALL), "metaspace",
                      ("<unk>", "<s>", "</s>", "[INST]", "[/INST]"), "<s>", "</s>", MISTRAL_TEMPLATE,
                      "LlamaTokenizer", extra_config={"add_bos_token": True, "add_eos_token": False,
                                                      "legacy": False}),
    # tokenizer.json's post-processor adds <s>, tokenizer_config.json says add_bos_token
    # false: transformers (5.24) follows tokenizer.json for a plain prompt (so does metalkv)
    "phi3": Family("phi3", llama_config(model_type="phi3", **SMALL), "metaspace",
                   ("<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"), "<s>",
                   "<|end|>", PHI3_TEMPLATE, "LlamaTokenizer",
                   extra_config={"add_bos_token": False, "add_eos_token": False, "legacy": False}),
    # no add_bos_token key: the BOS of a plain prompt is tokenizer.json's post-processor's
    "gemma2": Family("gemma2", gemma3_config(model_type="gemma2", **GEMMA_SMALL), "gemma",
                     ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"),
                     "<bos>", "<eos>", GEMMA_TEMPLATE, "GemmaTokenizer"),
    "gemma3": Family("gemma3", gemma3_config(**GEMMA_SMALL), "gemma",
                     ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"),
                     "<bos>", "<eos>", GEMMA_TEMPLATE, "GemmaTokenizer",
                     extra_config={"add_bos_token": True, "add_eos_token": False}),
}


def _add_word(word: str, tokens: list, merges: list) -> None:
    """Tokens and merges that build `word` left to right from its first symbol."""
    piece = word[0]
    for ch in word[1:]:
        if (piece, ch) not in merges:
            merges.append((piece, ch))
        piece += ch
        if piece not in tokens:
            tokens.append(piece)


def _sentencepiece_vocab(specials: tuple) -> tuple[dict, list]:
    """specials, the 256 byte-fallback tokens (é and other non-ASCII text goes through
    them), "▁", a..z, and "▁word" for the words of WORDS."""
    tokens = list(specials) + [f"<0x{b:02X}>" for b in range(256)] + ["▁"] + list(LETTERS)
    merges: list = []
    for w in WORDS.split():
        _add_word("▁" + w, tokens, merges)
    return {t: i for i, t in enumerate(tokens)}, merges


def _byte_level_vocab(specials: tuple) -> tuple[dict, list]:
    """The 256 byte symbols, "word" and "Ġword" for the words of WORDS, then the specials."""
    from tokenizers import pre_tokenizers

    tokens = sorted(pre_tokenizers.ByteLevel.alphabet())
    merges: list = []
    for w in WORDS.split():
        _add_word("Ġ" + w, tokens, merges)
        _add_word(w, tokens, merges)
    return {t: i for i, t in enumerate(tokens + list(specials))}, merges


def build_tokenizer(f: Family):
    """A tokenizers.Tokenizer in the family's real pipeline."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    if f.kind == "byte_level":
        vocab, merges = _byte_level_vocab(f.specials)
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
        if f.tokenizer_class == "Qwen2Tokenizer":
            tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(f.regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
    else:
        vocab, merges = _sentencepiece_vocab(f.specials)
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True,
                                   unk_token="<unk>"))
        if f.kind == "gemma":
            tok.normalizer = normalizers.Replace(" ", "▁")
            tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)
            tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
        else:
            tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
            tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                             decoders.Strip(content=" ", left=1)])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in f.specials])
    if f.bos is not None:
        tok.post_processor = processors.TemplateProcessing(single=f"{f.bos}:0 $A:0",
                                                           pair=f"{f.bos}:0 $A:0 {f.bos}:1 $B:1",
                                                           special_tokens=[(f.bos, vocab[f.bos])])
    elif f.kind == "byte_level":
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def write_checkpoint(d: pathlib.Path, f: Family) -> dict:
    """The HF directory of family f (random weights); returns the vocabulary."""
    tok = build_tokenizer(f)
    vocab = tok.get_vocab(with_added_tokens=True)
    config = {**f.config, "vocab_size": len(vocab), "bos_token_id": vocab.get(f.bos) if f.bos else None,
              "eos_token_id": vocab[f.eos]}
    write_hf_dir(d, config, dtype="F32")
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": f.tokenizer_class, "bos_token": f.bos, "eos_token": f.eos,
        "chat_template": f.template, **f.extra_config}))
    return vocab


def write_family_gguf(path: pathlib.Path, f: Family, *, add_bos: bool) -> None:
    """A llama GGUF with family f's byte-level vocabulary, template and add_bos_token."""
    import gguf

    tok = build_tokenizer(f)
    vocab = tok.get_vocab(with_added_tokens=True)
    tokens = sorted(vocab, key=vocab.get)
    model = json.loads(tok.to_str())["model"]
    S, B, I = gguf.GGUFValueType.STRING, gguf.GGUFValueType.BOOL, gguf.GGUFValueType.INT32
    kv = {"tokenizer.ggml.model": ("gpt2", S), "tokenizer.ggml.pre": (f.gguf_pre, S),
          "tokenizer.ggml.tokens": (tokens, gguf.GGUFValueType.ARRAY, S),
          "tokenizer.ggml.token_type": ([3 if t in f.specials else 1 for t in tokens],
                                        gguf.GGUFValueType.ARRAY, I),
          "tokenizer.ggml.merges": ([m if isinstance(m, str) else " ".join(m) for m in model["merges"]],
                                    gguf.GGUFValueType.ARRAY, S),
          "tokenizer.ggml.eos_token_id": (vocab[f.eos], gguf.GGUFValueType.UINT32),
          "tokenizer.ggml.add_bos_token": (add_bos, B),
          "tokenizer.chat_template": (f.template, S)}
    if f.bos is not None:
        kv["tokenizer.ggml.bos_token_id"] = (vocab[f.bos], gguf.GGUFValueType.UINT32)
    write_gguf(path, vocab=len(tokens), hidden=64, n_heads=2, n_kv_heads=1, head_dim=32, ffn=64, set_kv=kv)
