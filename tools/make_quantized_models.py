#!/usr/bin/env python3
"""GGUF test models quantized by llama.cpp's own quantizer, so the block layouts
the kernels are tested on are llama.cpp's, not ours or gguf-py's.

    pip install llama-cpp-python==0.3.36      # builds llama.cpp from source (~5-10 min on 2 cores)
    python tools/make_quantized_models.py     # tests/data/quantized/*.gguf + models.json

A tiny llama (tests/models/tiny.py's write_gguf at MODEL's sizes, every matrix
F16, TINY_VOCAB's tokenizer) is written to a temporary F16 GGUF and quantized
with `llama_cpp.llama_model_quantize` to each of FTYPES. Every matrix row is a
multiple of 256, so K-quant ftypes put K-quants in every matrix (llama.cpp
falls back to Q5_0/Q5_1/Q8_0 for rows that are not). models.json records the
llama-cpp-python version, this command, the source model and, per file, its
size, sha256 and the count of each tensor type; tests/engine/test_quantized_models.py
checks the files against it, so CI needs no llama.cpp.

    python tools/make_quantized_models.py --model IN.gguf --ftype Q4_K_M --out OUT.gguf

requantizes any GGUF (allow_requantize: an already quantized file is dequantized
and quantized again), e.g. the default model to Q4_K_M; nothing is recorded.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import sys
import tempfile
from collections import Counter

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT_DIR = ROOT / "tests" / "data" / "quantized"

# One layer: the files stay a few hundred KB. hidden, ffn and the q/k/v widths are
# multiples of 256; head_dim 64 is a size the attention kernels take.
MODEL = dict(n_layers=1, hidden=256, n_heads=4, n_kv_heads=1, head_dim=64, ffn=256, vocab=64)
SEED = 0
FTYPES = ["Q4_K_M", "Q5_K_M", "Q6_K", "Q5_0", "Q5_1"]


def write_source(path: pathlib.Path) -> None:
    """The tiny F16 model (norms stay F32, as convert_hf_to_gguf writes them)."""
    import gguf

    sys.path.insert(0, str(ROOT / "tests"))
    from models.tiny import TINY_VOCAB, write_gguf

    n = MODEL["n_layers"]
    matrices = ["token_embd.weight"] + [f"blk.{i}.{m}.weight" for i in range(n) for m in
                                        ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                                         "ffn_down")]
    write_gguf(path, seed=SEED, tokenizer=TINY_VOCAB,
               quantize={m: gguf.GGMLQuantizationType.F16 for m in matrices}, **MODEL)


def quantize(src: pathlib.Path, dst: pathlib.Path, ftype: str, *, requantize: bool = False) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.nthread = 2
    params.allow_requantize = requantize
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    if rc != 0:
        raise SystemExit(f"llama_model_quantize({src} -> {dst}, {ftype}) failed with {rc}")


def tensors(path: pathlib.Path) -> dict[str, str]:
    """tensor name -> ggml type, lower case ("q4_k")."""
    import gguf

    return {t.name: t.tensor_type.name.lower() for t in gguf.GGUFReader(str(path)).tensors}


def tensor_types(path: pathlib.Path) -> dict[str, int]:
    return dict(sorted(Counter(tensors(path).values()).items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=pathlib.Path, help="requantize this GGUF instead (with --ftype, --out)")
    ap.add_argument("--ftype", help="llama.cpp ftype name, e.g. Q4_K_M")
    ap.add_argument("--out", type=pathlib.Path)
    a = ap.parse_args()
    if a.model is not None:
        if not (a.ftype and a.out):
            ap.error("--model needs --ftype and --out")
        quantize(a.model, a.out, a.ftype, requantize=True)
        print(f"{a.out}: {a.out.stat().st_size} bytes, {tensor_types(a.out)}")
        return

    import llama_cpp

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    files = {}
    with tempfile.TemporaryDirectory() as tmp:
        src = pathlib.Path(tmp) / "tiny_f16.gguf"
        write_source(src)
        for ftype in FTYPES:
            dst = OUT_DIR / f"tiny_{ftype.lower()}.gguf"
            quantize(src, dst, ftype)
            data = dst.read_bytes()
            files[dst.name] = dict(ftype=ftype, bytes=len(data), sha256=hashlib.sha256(data).hexdigest(),
                                   tensor_types=tensor_types(dst), tensors=tensors(dst))
            print(f"{dst.relative_to(ROOT)}: {len(data)} bytes, {files[dst.name]['tensor_types']}")
    record = dict(
        tool="tools/make_quantized_models.py", command="python tools/make_quantized_models.py",
        llama_cpp_python=llama_cpp.__version__,
        source=dict(writer="tests/models/tiny.py write_gguf (matrices F16, norms F32, TINY_VOCAB)",
                    seed=SEED, **MODEL),
        quantizer="llama_cpp.llama_model_quantize, default params, nthread=2", files=files)
    (OUT_DIR / "models.json").write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
