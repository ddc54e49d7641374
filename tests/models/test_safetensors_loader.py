"""HF directories (config.json + *.safetensors): name mapping, dtype conversion,
and errors naming the file and tensor; then real transformers checkpoints."""
from __future__ import annotations

import json

import numpy as np
import pytest

from metalkv.models import ModelLoadError, load_model
from metalkv.models.safetensors_loader import canonical_name, load_safetensors_dir

from .tiny import gemma3_config, llama_config, write_hf_dir, write_safetensors

HF_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "model.layers.1.input_layernorm.weight": "blk.1.attn_norm.weight",
    "model.layers.1.self_attn.q_proj.weight": "blk.1.attn_q.weight",
    "model.layers.1.self_attn.k_proj.weight": "blk.1.attn_k.weight",
    "model.layers.1.self_attn.v_proj.weight": "blk.1.attn_v.weight",
    "model.layers.1.self_attn.o_proj.weight": "blk.1.attn_output.weight",
    "model.layers.1.post_attention_layernorm.weight": "blk.1.ffn_norm.weight",
    "model.layers.1.mlp.gate_proj.weight": "blk.1.ffn_gate.weight",
    "model.layers.1.mlp.up_proj.weight": "blk.1.ffn_up.weight",
    "model.layers.1.mlp.down_proj.weight": "blk.1.ffn_down.weight",
}


def test_llama_names_and_values(tmp_path):
    arrays = write_hf_dir(tmp_path, llama_config(), dtype="F32")
    cfg, tensors, _ = load_safetensors_dir(tmp_path)
    assert len(tensors) == len(arrays) == 21
    for hf, gg in HF_TO_GGUF.items():
        t = tensors[gg]
        a = arrays[hf]
        assert t.shape == a.shape
        if a.ndim == 1:  # norms stay f32, exactly
            assert t.dtype == "f32" and t.data.dtype == np.float32
            np.testing.assert_array_equal(t.data, a)
        else:  # f32 matrices stay f32 (the kernels read f32), exactly
            assert t.dtype == "f32" and t.data.dtype == np.float32
            np.testing.assert_array_equal(t.data, a)


def test_bf16_sharded(tmp_path):
    arrays = write_hf_dir(tmp_path, llama_config(), dtype="BF16", shards=3)
    _, tensors, _ = load_safetensors_dir(tmp_path)
    a = arrays["model.layers.0.self_attn.q_proj.weight"]
    bf16 = (a.view(np.uint32) & 0xFFFF0000).view(np.float32)  # what was written: top 16 bits
    np.testing.assert_array_equal(tensors["blk.0.attn_q.weight"].data, bf16.astype(np.float16))
    n = arrays["model.norm.weight"]
    np.testing.assert_array_equal(tensors["output_norm.weight"].data, (n.view(np.uint32) & 0xFFFF0000).view(np.float32))


def test_gemma3_names(tmp_path):
    write_hf_dir(tmp_path, gemma3_config())
    cfg, tensors, _ = load_safetensors_dir(tmp_path)
    assert cfg.arch == "gemma3" and "output.weight" not in tensors
    for suffix, shape in [("attn_q_norm.weight", (16,)), ("attn_k_norm.weight", (16,)),
                          ("post_attention_norm.weight", (32,)), ("ffn_norm.weight", (32,)),
                          ("post_ffw_norm.weight", (32,)), ("attn_q.weight", (64, 32))]:
        assert tensors[f"blk.6.{suffix}"].shape == shape
    assert canonical_name("model.layers.3.post_attention_layernorm.weight", "gemma3") == \
        "blk.3.post_attention_norm.weight"
    assert canonical_name("model.language_model.layers.3.mlp.up_proj.weight", "gemma3") == "blk.3.ffn_up.weight"
    assert canonical_name("model.vision_tower.encoder.layers.0.mlp.fc1.weight", "gemma3") is None


def test_qwen3_and_gemma2_names(tmp_path):
    write_hf_dir(tmp_path / "q", llama_config(model_type="qwen3", head_dim=8))
    cfg, tensors, _ = load_safetensors_dir(tmp_path / "q")
    assert cfg.arch == "qwen3" and tensors["blk.1.attn_q_norm.weight"].shape == (8,)
    assert tensors["blk.1.ffn_norm.weight"].shape == (32,) and "blk.1.post_attention_norm.weight" not in tensors
    write_hf_dir(tmp_path / "g", {**gemma3_config(), "model_type": "gemma2"})
    cfg, tensors, _ = load_safetensors_dir(tmp_path / "g")
    assert cfg.arch == "gemma2" and "blk.0.attn_q_norm.weight" not in tensors
    assert {"blk.0.post_attention_norm.weight", "blk.0.ffn_norm.weight", "blk.0.post_ffw_norm.weight"} <= set(tensors)


def test_phi3_fused_tensors_become_row_views(tmp_path):
    """qkv_proj (q rows, k rows, v rows) and gate_up_proj (gate rows, up rows) are split
    into the canonical tensors as views of the file's data, not copies."""
    arrays = write_hf_dir(tmp_path, llama_config(model_type="phi3"), dtype="F16")
    cfg, tensors, _ = load_safetensors_dir(tmp_path)
    assert cfg.arch == "phi3" and not {n for n in tensors if "qkv" in n or "gate_up" in n}
    qkv = arrays["model.layers.1.self_attn.qkv_proj.weight"].astype(np.float16)  # (32 + 16 + 16, 32)
    gate_up = arrays["model.layers.1.mlp.gate_up_proj.weight"].astype(np.float16)  # (2 * 48, 32)
    for name, want in [("attn_q", qkv[:32]), ("attn_k", qkv[32:48]), ("attn_v", qkv[48:]),
                       ("ffn_gate", gate_up[:48]), ("ffn_up", gate_up[48:])]:
        t = tensors[f"blk.1.{name}.weight"]
        np.testing.assert_array_equal(t.data, want, err_msg=name)
        assert t.data.base is not None and not t.data.flags.owndata  # a view of the memory map
    assert np.shares_memory(tensors["blk.1.attn_q.weight"].data, tensors["blk.1.attn_v.weight"].data) is False


def test_fused_tensor_errors_name_the_file_tensor(tmp_path):
    write_hf_dir(tmp_path / "a", llama_config(model_type="phi3"),
                 reshape={"model.layers.0.self_attn.qkv_proj.weight": (60, 32)})
    with pytest.raises(ModelLoadError, match=r"fused tensor blk\.0\.attn_qkv\.weight \(model-00001-of-00001"
                                             r"\.safetensors:model\.layers\.0\.self_attn\.qkv_proj\.weight\) has "
                                             r"shape \(60, 32\), expected \(64, 32\) \(32 \+ 16 \+ 16 rows"):
        load_safetensors_dir(tmp_path / "a")
    d = tmp_path / "b"
    arrays = write_hf_dir(d, llama_config(model_type="phi3"), dtype="F32")
    arrays["model.layers.0.mlp.up_proj.weight"] = np.zeros((48, 32), np.float32)
    write_safetensors(d / "model-00001-of-00001.safetensors", arrays, "F32")
    with pytest.raises(ModelLoadError, match=r"both the fused tensor blk\.0\.ffn_gate_up\.weight .* and "
                                             r"blk\.0\.ffn_up\.weight"):
        load_safetensors_dir(d)
    d = tmp_path / "c"
    write_hf_dir(d, llama_config(model_type="phi3"), omit=("model.layers.1.mlp.gate_up_proj.weight",))
    with pytest.raises(ModelLoadError, match=r"missing tensor\(s\) blk\.1\.ffn_gate\.weight "
                                             r"\(model\.layers\.1\.mlp\.gate_up_proj\.weight\)"):
        load_safetensors_dir(d)


def test_missing_tensor_names_both_spellings(tmp_path):
    write_hf_dir(tmp_path, llama_config(), omit=("model.layers.1.mlp.up_proj.weight",))
    with pytest.raises(ModelLoadError, match=r"missing tensor\(s\) blk.1.ffn_up.weight "
                                             r"\(model.layers.1.mlp.up_proj.weight\)"):
        load_safetensors_dir(tmp_path)


def test_untied_without_lm_head(tmp_path):
    write_hf_dir(tmp_path, llama_config(tie_word_embeddings=True))
    (tmp_path / "config.json").write_text(json.dumps(llama_config(tie_word_embeddings=False)))
    with pytest.raises(ModelLoadError, match=r"output.weight \(lm_head.weight\)"):
        load_safetensors_dir(tmp_path)


def test_misshapen_tensor(tmp_path):
    write_hf_dir(tmp_path, llama_config(), reshape={"model.layers.0.self_attn.k_proj.weight": (8, 32)})
    with pytest.raises(ModelLoadError, match=r"blk.0.attn_k.weight \(model.layers.0.self_attn.k_proj.weight\) "
                                             r"has shape \(8, 32\), expected \(16, 32\)"):
        load_safetensors_dir(tmp_path)


@pytest.mark.parametrize("keep", [-1, -100, 20])  # lose the last byte, the last 100, all but 20
def test_truncated_file(tmp_path, keep):
    write_hf_dir(tmp_path, llama_config())
    f = next(tmp_path.glob("*.safetensors"))
    f.write_bytes(f.read_bytes()[:keep])
    with pytest.raises(ModelLoadError, match=rf"{f.name}: .*(truncated|does not fit)"):
        load_safetensors_dir(tmp_path)


def test_corrupt_header(tmp_path):
    write_hf_dir(tmp_path, llama_config())
    f = next(tmp_path.glob("*.safetensors"))
    data = bytearray(f.read_bytes())
    data[8] = ord("#")
    f.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match=rf"{f.name}: header is not valid JSON"):
        load_safetensors_dir(tmp_path)
    f.write_bytes(b"\x00" * 4)
    with pytest.raises(ModelLoadError, match=r"not a safetensors file, or truncated"):
        load_safetensors_dir(tmp_path)


def test_inconsistent_offsets(tmp_path):
    write_hf_dir(tmp_path, llama_config())
    f = next(tmp_path.glob("*.safetensors"))
    data = f.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    header["model.norm.weight"]["shape"] = [33]
    text = json.dumps(header, separators=(",", ":")).encode().ljust(n)
    assert len(text) == n
    f.write_bytes(data[:8] + text + data[8 + n:])
    with pytest.raises(ModelLoadError, match=r"tensor model.norm.weight of shape \(33,\) F16 needs 66 bytes"):
        load_safetensors_dir(tmp_path)


def test_unsupported_dtype_and_f16_overflow(tmp_path):
    import safetensors.numpy

    write_hf_dir(tmp_path, llama_config())
    f = next(tmp_path.glob("*.safetensors"))
    safetensors.numpy.save_file({"model.norm.weight": np.zeros(32, np.int8)}, str(f))
    with pytest.raises(ModelLoadError, match=r"tensor model.norm.weight has dtype I8; supported: F32, F16, BF16"):
        load_safetensors_dir(tmp_path)
    arrays = write_hf_dir(tmp_path / "big", llama_config(), dtype="BF16")
    (tmp_path / "big" / "model-00001-of-00001.safetensors").unlink()
    arrays["model.layers.0.mlp.up_proj.weight"] *= 1e5  # bf16 holds it, f16 cannot
    write_safetensors(tmp_path / "big" / "model.safetensors", arrays, "BF16")
    with pytest.raises(ModelLoadError, match=r"blk.0.ffn_up.weight holds values up to .* beyond f16"):
        load_safetensors_dir(tmp_path / "big")


def test_missing_config_and_weights(tmp_path):
    with pytest.raises(ModelLoadError, match=r"no config.json"):
        load_safetensors_dir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(llama_config()))
    with pytest.raises(ModelLoadError, match=r"no \*.safetensors files"):
        load_safetensors_dir(tmp_path)


# -- real transformers checkpoints (skipped without torch + transformers) ---------------

ARCH_OF = {"llama": "llama", "qwen2": "llama", "mistral": "llama", "qwen3": "qwen3", "phi3": "phi3",
           "gemma2": "gemma2", "gemma3": "gemma3"}


@pytest.mark.parametrize("arch", list(ARCH_OF))
def test_transformers_checkpoint(tmp_path, arch):
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    small = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                 vocab_size=128)
    if arch == "llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(num_hidden_layers=2, tie_word_embeddings=False, **small))
    elif arch == "qwen2":
        model = tf.Qwen2ForCausalLM(tf.Qwen2Config(num_hidden_layers=2, **small))
    elif arch == "qwen3":
        model = tf.Qwen3ForCausalLM(tf.Qwen3Config(num_hidden_layers=2, head_dim=16, **small))
    elif arch == "mistral":
        model = tf.MistralForCausalLM(tf.MistralConfig(num_hidden_layers=2, sliding_window=32, **small))
    elif arch == "phi3":
        model = tf.Phi3ForCausalLM(tf.Phi3Config(num_hidden_layers=2, partial_rotary_factor=0.5, pad_token_id=None,
                                                   bos_token_id=None, eos_token_id=None, **small))
    elif arch == "gemma2":
        model = tf.Gemma2ForCausalLM(tf.Gemma2Config(num_hidden_layers=4, head_dim=32, **small))
    else:
        model = tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(num_hidden_layers=7, head_dim=32,
                                                         sliding_window=16, **small))
    model = model.to(torch.bfloat16)
    model.save_pretrained(tmp_path)
    m = load_model(tmp_path)
    assert m.tokenizer is None and m.config.arch == ARCH_OF[arch]
    assert m.config.attn_bias == (arch == "qwen2")
    fused = {"attn_qkv.weight": ("attn_q", "attn_k", "attn_v"), "ffn_gate_up.weight": ("ffn_gate", "ffn_up")}
    sd = model.state_dict()
    for hf_name, value in sd.items():
        name = canonical_name(hf_name, m.config.arch)
        if name == "output.weight" and m.config.tie_embeddings:
            assert name not in m.tensors
            continue
        ref = value.float().numpy()
        layer, kind = name.rsplit(".", 2)[0], name.split(".", 2)[-1]
        parts = [f"{layer}.{p}.weight" for p in fused[kind]] if kind in fused else [name]
        got = np.concatenate([m.tensors[p].data.astype(np.float32) for p in parts])
        # bf16 -> f16 is exact in range except below f16's normal range (1 ulp there)
        np.testing.assert_allclose(got, ref, rtol=2 ** -10, atol=2 ** -24, err_msg=name)
    n_split = 3 * m.config.n_layers if arch == "phi3" else 0  # 2 fused tensors -> 5 per layer
    assert len(m.tensors) == len(sd) - (1 if m.config.tie_embeddings else 0) + n_split


def test_full_directory_load(tmp_path, capsys):
    from tokenizers import AddedToken, Tokenizer as HFTokenizer, models, pre_tokenizers

    write_hf_dir(tmp_path, llama_config(eos_token_id=2))
    vocab = {"<s>": 0, "h": 1, "i": 2, "hi": 3, "Ġ": 4}
    t = HFTokenizer(models.BPE(vocab=vocab, merges=[("h", "i")]))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.add_special_tokens([AddedToken("<|im_end|>", special=True, normalized=False)])  # id 5
    t.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages[0]['content'] }}"}))
    m = load_model(tmp_path, progress=True)
    assert "tensors" in capsys.readouterr().err  # the tqdm bar went to stderr, not stdout
    assert m.path == tmp_path and m.metadata["model_type"] == "llama"
    assert m.config.eos_ids == (2, 5)  # config.json's, plus <|im_end|> as llama.cpp would
    assert m.tokenizer.encode("hi<|im_end|>") == [3, 5]
    assert m.chat_template.render([{"role": "user", "content": "hi"}]) == "hi"
