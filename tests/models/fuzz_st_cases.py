"""Hugging Face directory mutations for test_fuzz_model_files.py: each case edits
a copy of a tiny model directory (the safetensors header, its bytes, config.json,
generation_config.json, tokenizer.json) and says what must follow (REFUSED, SAME,
EITHER as in fuzz_gguf_cases). F16 <-> BF16 is left out: same size, both
readable, so no check can tell (docs/MODELS.md)."""
from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .fuzz_gguf_cases import REFUSED, SAME
from .tiny import safetensors_parts, write_safetensors_parts


@dataclass(frozen=True)
class DirCase:
    id: str
    mutate: Callable[[pathlib.Path], None]
    expect: str
    names: str | None = None


def _weights(d: pathlib.Path) -> pathlib.Path:
    return next(d.glob("*.safetensors"))


def header(change: Callable[[dict], object]):
    """change(header) edits the dict in place, or returns the header text to write."""
    def mutate(d: pathlib.Path) -> None:
        f = _weights(d)
        h, body = safetensors_parts(f)
        out = change(h)
        write_safetensors_parts(f, out if isinstance(out, (str, bytes)) else h, body)
    return mutate


def raw_file(change: Callable[[bytes], bytes]):
    def mutate(d: pathlib.Path) -> None:
        f = _weights(d)
        f.write_bytes(change(f.read_bytes()))
    return mutate


def entry(name: str, **fields):
    def change(h: dict) -> None:
        h[name].update({k: (v(h[name]) if callable(v) else v) for k, v in fields.items()})
    return header(change)


def config(path: str = "config.json", **over):
    """Set (or, with None, null) keys of a JSON file in the directory."""
    def mutate(d: pathlib.Path) -> None:
        f = d / path
        c = json.loads(f.read_text()) if f.is_file() else {}
        c.update(over)
        f.write_text(json.dumps(c))
    return mutate


def text(path: str, content: str | bytes):
    def mutate(d: pathlib.Path) -> None:
        (d / path).write_bytes(content if isinstance(content, bytes) else content.encode())
    return mutate


def value_at(name: str, index: int, value: float):
    """Overwrite one element of a tensor in its own dtype."""
    def mutate(d: pathlib.Path) -> None:
        f = _weights(d)
        h, body = safetensors_parts(f)
        dtype = h[name]["dtype"]
        raw = {"F16": np.float16(value).tobytes(), "F32": np.float32(value).tobytes(),
               "BF16": (np.float32(value).view(np.uint32) >> 16).astype(np.uint16).tobytes()}[dtype]
        at = h[name]["data_offsets"][0] + index * len(raw)
        body = body[:at] + raw + body[at + len(raw):]
        write_safetensors_parts(f, h, body)
    return mutate


def tensor_cases(prefix: str, name: str, shape: tuple[int, ...], other: str) -> list[DirCase]:
    p = f"{prefix}/header/{name}"

    def alias(h: dict) -> None:
        h[name]["data_offsets"] = list(h[other]["data_offsets"])
        if h[other]["shape"] != h[name]["shape"]:
            h[name]["shape"], h[name]["dtype"] = h[other]["shape"], h[other]["dtype"]

    cases = [
        DirCase(f"{p}/dtype=F32", entry(name, dtype="F32"), REFUSED, name),
        DirCase(f"{p}/dtype=I8", entry(name, dtype="I8"), REFUSED, name),
        DirCase(f"{p}/dtype=F64", entry(name, dtype="F64"), REFUSED, name),
        DirCase(f"{p}/dtype=5", entry(name, dtype=5), REFUSED, name),
        DirCase(f"{p}/shape[0]+1", entry(name, shape=lambda e: [e["shape"][0] + 1] + e["shape"][1:]),
                REFUSED, name),
        DirCase(f"{p}/shape=[]", entry(name, shape=[]), REFUSED, name),
        DirCase(f"{p}/shape=float", entry(name, shape=lambda e: [float(x) for x in e["shape"]]), REFUSED, name),
        DirCase(f"{p}/shape=negative", entry(name, shape=lambda e: [-x for x in e["shape"]]), REFUSED, name),
        DirCase(f"{p}/shape=string", entry(name, shape="128"), REFUSED, name),
        DirCase(f"{p}/shape=huge", entry(name, shape=[1 << 40] * 2), REFUSED, name),
        DirCase(f"{p}/offsets+2", entry(name, data_offsets=lambda e: [x + 2 for x in e["data_offsets"]]),
                REFUSED),
        DirCase(f"{p}/offsets-2", entry(name, data_offsets=lambda e: [max(0, x - 2) for x in e["data_offsets"]]),
                REFUSED),
        DirCase(f"{p}/offsets=reversed", entry(name, data_offsets=lambda e: e["data_offsets"][::-1]),
                REFUSED, name),
        DirCase(f"{p}/offsets=[begin]", entry(name, data_offsets=lambda e: e["data_offsets"][:1]),
                REFUSED, name),
        DirCase(f"{p}/offsets=strings", entry(name, data_offsets=lambda e: [str(x) for x in e["data_offsets"]]),
                REFUSED, name),
        DirCase(f"{p}/offsets=bools", entry(name, data_offsets=[False, True]), REFUSED, name),
        DirCase(f"{p}/offsets=end+2^40", entry(name, data_offsets=lambda e: [e["data_offsets"][0], 1 << 40]),
                REFUSED, name),
        DirCase(f"{p}/aliases-{other}", header(alias), REFUSED),
        DirCase(f"{p}/dropped", header(lambda h: h.pop(name)), REFUSED),
        DirCase(f"{p}/renamed-unknown", header(lambda h: h.update({name + "_x": h.pop(name)})), REFUSED),
        DirCase(f"{p}/entry=list", header(lambda h: h.update({name: [1, 2]})), REFUSED, name),
        DirCase(f"{p}/nan", value_at(name, 0, float("nan")), REFUSED, name),
        DirCase(f"{p}/inf-last", value_at(name, int(np.prod(shape)) - 1, float("-inf")), REFUSED, name),
    ]
    if len(shape) == 2 and shape[0] != shape[1]:
        cases.append(DirCase(f"{p}/shape=swapped", entry(name, shape=lambda e: e["shape"][::-1]),
                     REFUSED, name))
    return cases


def _extra_tensor(h: dict) -> None:
    """An unused (vision) tensor after the others: ignored, the model is the same."""
    end = max(v["data_offsets"][1] for k, v in h.items() if k != "__metadata__")
    h["model.vision_tower.x.weight"] = {"dtype": "F16", "shape": [1], "data_offsets": [end, end + 2]}


def file_cases(prefix: str) -> list[DirCase]:
    def header_len(fn):
        return raw_file(lambda b: fn(int.from_bytes(b[:8], "little"), len(b)).to_bytes(8, "little") + b[8:])

    def cut(fn):
        return raw_file(lambda b: b[:fn(int.from_bytes(b[:8], "little"), len(b))])

    def header_text(fn):
        return raw_file(lambda b: (lambda n: b[:8] + fn(b[8:8 + n]) + b[8 + n:])(int.from_bytes(b[:8], "little")))

    return [
        DirCase(f"{prefix}/file/header-length=0", header_len(lambda n, s: 0), REFUSED, "header length"),
        DirCase(f"{prefix}/file/header-length=1", header_len(lambda n, s: 1), REFUSED, "header length"),
        DirCase(f"{prefix}/file/header-length-1", header_len(lambda n, s: n - 1), REFUSED),
        DirCase(f"{prefix}/file/header-length+1", header_len(lambda n, s: n + 1), REFUSED),
        DirCase(f"{prefix}/file/header-length=size", header_len(lambda n, s: s), REFUSED, "header length"),
        DirCase(f"{prefix}/file/header-length=2^63", header_len(lambda n, s: 1 << 63),
                REFUSED, "header length"),
        DirCase(f"{prefix}/file/header-json-cut", header_text(lambda t: t[:-5] + b" " * 5),
                REFUSED, "not valid JSON"),
        DirCase(f"{prefix}/file/header-not-utf8", header_text(lambda t: b"\xff" + t[1:]),
                REFUSED, "not valid JSON"),
        DirCase(f"{prefix}/file/header=[]", header(lambda h: "[]" + " " * 10), REFUSED, "not a JSON object"),
        DirCase(f"{prefix}/file/header-deep-nesting", header(lambda h: "[" * 100000), REFUSED),
        DirCase(f"{prefix}/file/header-padded", header(lambda h: json.dumps(h) + " " * 64), SAME),
        DirCase(f"{prefix}/file/metadata=format-pt",
                header(lambda h: h.update({"__metadata__": {"format": "pt"}})), SAME),
        DirCase(f"{prefix}/file/metadata=list", header(lambda h: h.update({"__metadata__": [1]})),
                REFUSED, "__metadata__"),
        DirCase(f"{prefix}/file/duplicate-name", header(lambda h: json.dumps(h).replace(
            '"model.norm.weight"', '"lm_head.weight"')), REFUSED, "twice"),
        DirCase(f"{prefix}/file/extra-unused-tensor", lambda d: (header(_extra_tensor)(d), raw_file(
            lambda b: b + b"\0\0")(d)), SAME),
        DirCase(f"{prefix}/file/truncate-at=0", cut(lambda n, s: 0), REFUSED),
        DirCase(f"{prefix}/file/truncate-at=7", cut(lambda n, s: 7), REFUSED),
        DirCase(f"{prefix}/file/truncate-at=8", cut(lambda n, s: 8), REFUSED),
        DirCase(f"{prefix}/file/truncate-in-header", cut(lambda n, s: 8 + n - 1), REFUSED),
        DirCase(f"{prefix}/file/truncate-at-data", cut(lambda n, s: 8 + n), REFUSED),
        DirCase(f"{prefix}/file/truncate-at-data+1", cut(lambda n, s: 8 + n + 1), REFUSED),
        DirCase(f"{prefix}/file/truncate-half", cut(lambda n, s: s // 2), REFUSED, "truncated"),
        DirCase(f"{prefix}/file/truncate-last-byte", cut(lambda n, s: s - 1), REFUSED, "truncated"),
        DirCase(f"{prefix}/file/append-1", raw_file(lambda b: b + b"\0"), REFUSED, "past the"),
        DirCase(f"{prefix}/file/append-16", raw_file(lambda b: b + b"\0" * 16), REFUSED, "past the"),
    ]


def _compact(v) -> str:
    return json.dumps(v, separators=(",", ":"))


def config_cases(prefix: str) -> list[DirCase]:
    c = f"{prefix}/config"
    refused = {
        "num_attention_heads": ["2", 0, 3, 4, -2, 2.0, True, None, [2]],
        "num_key_value_heads": [0, 2, "1", 1.5, None],  # null: as many as the query heads
        "num_hidden_layers": [0, 1, 3, 1 << 40, "2", False],
        "hidden_size": [0, 127, 129, 256, "128", None],
        "intermediate_size": [0, 63, 64.5, None],
        "vocab_size": [0, 63, 65, None, "64"],
        "head_dim": [0, 32, 63, "64"],
        "rms_norm_eps": [0, -1e-6, 2.0, "1e-6", True, float("nan"), float("inf")],
        "rope_theta": [0, 1, -10000.0, "10000", float("inf")],
        "max_position_embeddings": [0, -1, "2048", 1 << 40],
        "tie_word_embeddings": ["false", 0],  # true ties lm_head away, as transformers does: valid
        "attention_bias": [1, "no", True],
        "mlp_bias": [True, "x"],
        "model_type": [5, "mamba", None],
        "hidden_act": ["relu", 3],
        "bos_token_id": [64, -1, "1", [1, 2]],
        "eos_token_id": [64, [2, 64], "2", 2.0],
        "pad_token_id": [64, -1],
        "layer_types": [["full_attention"], "full", ["full_attention", "local"]],
        "rope_scaling": ["linear", [1], {"rope_type": "linear", "factor": 0}, {"rope_type": "linear"},
                         {"rope_type": "linear", "factor": "2"}, {"rope_type": "dynamic", "factor": 2.0},
                         {"rope_type": "yarn", "factor": 0}, {"rope_type": "yarn", "beta_fast": 0.5},
                         {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 8192},
                         {"rope_type": "llama3", "factor": 8.0}],
        "rope_parameters": [5],
    }
    same = {"tie_word_embeddings": [None, False], "max_position_embeddings": [None, 4096],
            "rope_theta": [None], "rms_norm_eps": [None], "hidden_act": [None, "silu"],
            "bos_token_id": [None, 0, 63], "eos_token_id": [None, [0, 63]], "attention_bias": [None, False],
            "head_dim": [None, 64], "mlp_bias": [None, False], "pad_token_id": [None, 0],
            "rope_scaling": [None, {"rope_type": "default"}, {"rope_type": "linear", "factor": 1.0}],
            "num_key_value_heads": [1], "layer_types": [None, ["full_attention"] * 2],
            "torch_dtype": ["bfloat16"], "unknown_key": [[1, {"a": None}]]}
    cases = [DirCase(f"{c}/{k}={_compact(v)}", config(**{k: v}), REFUSED) for k, vs in refused.items()
             for v in vs]
    cases += [DirCase(f"{c}/{k}={_compact(v)}", config(**{k: v}), SAME) for k, vs in same.items() for v in vs]
    cases += [
        DirCase(f"{c}/text=cut", lambda d: text("config.json", (d / "config.json").read_text()[:-3])(d),
                REFUSED, "not valid JSON"),
        DirCase(f"{c}/text=empty", text("config.json", ""), REFUSED, "not valid JSON"),
        DirCase(f"{c}/text=[]", text("config.json", "[]"), REFUSED, "expected a JSON object"),
        DirCase(f"{c}/text=null", text("config.json", "null"), REFUSED, "expected a JSON object"),
        DirCase(f"{c}/text=not-utf8", text("config.json", b"\xff{}"), REFUSED, "not valid JSON"),
        DirCase(f"{prefix}/generation_config/eos=99", config("generation_config.json", eos_token_id=99),
                REFUSED, "eos_token_id"),
        DirCase(f"{prefix}/generation_config/eos='2'", config("generation_config.json", eos_token_id="2"),
                REFUSED, "eos_token_id"),
        DirCase(f"{prefix}/generation_config/eos=2", config("generation_config.json", eos_token_id=2), SAME),
        DirCase(f"{prefix}/generation_config/text=[]", text("generation_config.json", "[]"),
                REFUSED, "generation_config.json"),
        DirCase(f"{prefix}/tokenizer.json/added_tokens=5", config("tokenizer.json", added_tokens=5),
                REFUSED, "added_tokens"),
        DirCase(f"{prefix}/tokenizer.json/text=cut", text("tokenizer.json", '{"added_tokens": ['),
                REFUSED, "tokenizer.json"),
    ]
    return cases


def gemma3_cases(prefix: str) -> list[DirCase]:
    """A few on a BF16 gemma3 directory: its own keys, and a bf16 NaN."""
    c = f"{prefix}/config"
    return [
        DirCase(f"{c}/sliding_window=0", config(sliding_window=0), REFUSED, "sliding_window"),
        DirCase(f"{c}/sliding_window='8'", config(sliding_window="8"), REFUSED, "sliding_window"),
        DirCase(f"{c}/sliding_window_pattern=0", config(sliding_window_pattern=0),
                REFUSED, "sliding_window_pattern"),
        DirCase(f"{c}/layer_types=short", config(layer_types=["sliding_attention"] * 6),
                REFUSED, "layer_types"),
        DirCase(f"{c}/query_pre_attn_scalar=0", config(query_pre_attn_scalar=0),
                REFUSED, "query_pre_attn_scalar"),
        DirCase(f"{c}/final_logit_softcapping=-1", config(final_logit_softcapping=-1.0),
                REFUSED, "final_logit_softcapping"),
        DirCase(f"{c}/final_logit_softcapping=nan", config(final_logit_softcapping=float("nan")),
                REFUSED, "final_logit_softcapping"),
        DirCase(f"{c}/final_logit_softcapping=null", config(final_logit_softcapping=None), SAME),
        DirCase(f"{c}/rope_local_base_freq=0", config(rope_local_base_freq=0), REFUSED, "rope_local_base_freq"),
        DirCase(f"{c}/text_config=5", text("config.json", json.dumps({"model_type": "gemma3", "text_config": 5})),
                REFUSED, "text_config"),
        DirCase(f"{prefix}/header/model.norm.weight/nan", value_at("model.norm.weight", 3, float("nan")),
                REFUSED, "model.norm.weight"),
        DirCase(f"{prefix}/header/q_norm/inf", value_at("model.layers.6.self_attn.q_norm.weight", 0, float("inf")),
                REFUSED, "q_norm"),
        DirCase(f"{prefix}/header/embed/dtype=F32", entry("model.embed_tokens.weight", dtype="F32"), REFUSED),
    ]
