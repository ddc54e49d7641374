"""The same weights as a Hugging Face directory and as a GGUF file give the same
logits. The GGUF is written the way llama.cpp's convert_hf_to_gguf.py lays
models out: Llama's q/k rows permuted so that llama.cpp's interleaved
("normal") rope applies, Gemma 3's norms stored as 1 + w, names and metadata in
GGUF form. This ties together the two loaders, the two rope styles and the
norm offset through the whole engine (the default model covers GGUF Llama
against llama.cpp; the transformers tests cover the HF side)."""
from __future__ import annotations

import gguf
import numpy as np
import pytest

import metalkv
from metalkv.models.safetensors_loader import canonical_name
from models.tiny import gemma3_config, llama_config, write_hf_dir, write_safetensors  # tests/ on sys.path
from devices import TEST_DEVICE  # tests/ is on sys.path

SIZES = dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64, vocab_size=64)


def interleave_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Per head, rows (0..d/2-1 | d/2..d-1) -> pairs (0, d/2), (1, d/2+1), ...:
    the NEOX pairing becomes the interleaved one."""
    d = w.shape[0] // n_heads
    return w.reshape(n_heads, 2, d // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf_from_hf(path, config: dict, arrays: dict[str, np.ndarray]) -> None:
    arch = "gemma3" if config["model_type"].startswith("gemma") else "llama"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(config["num_hidden_layers"])
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(config["num_attention_heads"])
    w.add_head_count_kv(config["num_key_value_heads"])
    w.add_rope_freq_base(config["rope_theta"])
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_vocab_size(config["vocab_size"])
    if arch == "gemma3":
        w.add_key_length(config["head_dim"])
        w.add_value_length(config["head_dim"])
        w.add_sliding_window(config["sliding_window"])
        w.add_float32(f"{arch}.rope.freq_base_swa", config["rope_local_base_freq"])
    for hf_name, a in arrays.items():
        name = canonical_name(hf_name, arch)
        if arch == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = config["num_attention_heads" if "attn_q" in name else "num_key_value_heads"]
            a = interleave_rows(a, heads)
        if arch == "gemma3" and name.endswith("norm.weight"):
            a = a + 1.0  # Gemma computes x * (1 + w); llama.cpp's GGUF stores 1 + w
        w.add_tensor(name, a.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


CASES = {
    "llama": llama_config(**SIZES),
    # head_dim 64, query scale 1/sqrt(head_dim) as llama.cpp assumes for gemma3 below 27B;
    # 7 layers, pattern 6: five sliding, one full, one sliding
    "gemma3": gemma3_config(**SIZES, head_dim=64, query_pre_attn_scalar=64, num_hidden_layers=7),
}


@pytest.mark.parametrize("name", list(CASES))
def test_gguf_and_hf_give_the_same_logits(tmp_path, name):
    config = CASES[name]
    # random std-1 weights, scaled down so that softmax stays far from one-hot
    arrays = {k: v * 0.3 for k, v in write_hf_dir(tmp_path / "hf", config, dtype="F32").items()}
    for f in (tmp_path / "hf").glob("*.safetensors"):
        f.unlink()
    write_safetensors(tmp_path / "hf" / "model.safetensors", arrays, "F32")
    write_gguf_from_hf(tmp_path / "m.gguf", config, arrays)

    ids = np.random.default_rng(1).integers(0, config["vocab_size"], 24).tolist()  # > 2 sliding windows
    hf = metalkv.Engine.load(tmp_path / "hf", device=TEST_DEVICE, context=32).logits(ids)
    gg = metalkv.Engine.load(tmp_path / "m.gguf", device=TEST_DEVICE, context=32).logits(ids)
    # same math, different summation order in rope'd dot products and K/V f16 rounding flips
    np.testing.assert_allclose(gg, hf, rtol=0, atol=1e-3 * np.abs(hf).max())
    assert (gg.argmax(1) == hf.argmax(1)).mean() > 0.9
