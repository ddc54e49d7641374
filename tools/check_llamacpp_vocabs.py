"""Our GGUF tokenizers against llama.cpp's own vocabulary tests.

llama.cpp's source tree carries vocabulary-only GGUFs of real models
(models/ggml-vocab-<name>.gguf) with test strings (.inp, separated by
"\\n__ggml_vocab_test__\\n") and the ids its tests/test-tokenizer-0 expects (.out,
one line of ids per string; add_special=false, parse_special=false). This runs
metalkv's Tokenizer.from_gguf_metadata over each and prints, per vocabulary, how
many strings give exactly llama.cpp's ids, and the first few that do not.

The files are not ours to commit (they hold the models' vocabularies); point this
at a llama.cpp checkout or the one vendored in llama-cpp-python's sdist:

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/lcp && tar xf ...
    python tools/check_llamacpp_vocabs.py /tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp/models

Exit status 1 if any supported vocabulary misses a case.
"""
from __future__ import annotations

import argparse
import pathlib
import sys

SEP = "\n__ggml_vocab_test__\n"


def metadata(path: pathlib.Path) -> dict:
    """The tokenizer keys of a vocabulary-only GGUF (gguf-py reads files that end where
    their data section would start; metalkv's reader refuses them as truncated)."""
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    return {k: f.contents() for k, f in r.fields.items() if k.startswith(("tokenizer.", "general."))}


def cases(path: pathlib.Path) -> list[tuple[str, list[int]]]:
    raw = path.with_suffix(".gguf.inp").read_text(encoding="utf-8")
    texts = raw.split(SEP)
    if texts and texts[-1].endswith("\n__ggml_vocab_test__"):  # the file's last separator has no newline after it
        texts[-1] = texts[-1][:-len("\n__ggml_vocab_test__")]
    outs = path.with_suffix(".gguf.out").read_text(encoding="utf-8").split("\n")
    outs = outs[:len(texts)]
    return [(t, [int(x) for x in o.split()]) for t, o in zip(texts, outs)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", type=pathlib.Path, help="llama.cpp's models/ folder")
    ap.add_argument("--show", type=int, default=3, help="failing strings shown per vocabulary")
    args = ap.parse_args()
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
    from metalkv.models import ModelLoadError, Tokenizer

    bad = 0
    for f in sorted(args.models.glob("ggml-vocab-*.gguf")):
        if not f.with_suffix(".gguf.inp").is_file():
            continue
        md = metadata(f)
        label = f"{f.name[len('ggml-vocab-'):-5]:16} {md.get('tokenizer.ggml.model')}/{md.get('tokenizer.ggml.pre')}"
        try:
            tok = Tokenizer.from_gguf_metadata(md)
        except ModelLoadError as e:
            print(f"{label:40} not supported: {e}")
            continue
        tests = cases(f)
        wrong = [(t, want, got) for t, want in tests
                 if (got := tok.encode(t, add_special=False, parse_special=False)) != want]
        bad += bool(wrong)
        print(f"{label:40} {len(tests) - len(wrong)}/{len(tests)} as llama.cpp")
        for t, want, got in wrong[:args.show]:
            print(f"    {t[:60]!r}\n      llama.cpp {want[:16]}\n      metalkv   {got[:16]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
