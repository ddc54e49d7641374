"""Logits of metalkv against transformers on a random Llama-3-8B-shaped model, on the GPU.

    python bench/gpu/logit_check.py [LAYERS=8] [POSITIONS=512]

Builds the model with transformers (f16 weights, llama3 rope scaling), saves it as an HF
directory, and prints max |metalkv - torch f32| and max |torch f16 - torch f32| over all
positions, per position band, and top-1 agreement. transformers' .to(float16) rounds the rotary
inv_freq buffer to f16, which puts a phase error growing with the position into *its* logits;
the script restores the float32 frequencies first, so both run the model the config defines.
Measured on an H200 (docs/CUDA.md): 8 layers, 512 positions, metalkv 0.0104, torch f16 0.029.
"""
import sys

import numpy as np
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

import metalkv

layers = int(sys.argv[1]) if len(sys.argv) > 1 else 8
n_ids = int(sys.argv[2]) if len(sys.argv) > 2 else 512
cfg = transformers.LlamaConfig(
    hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers, num_attention_heads=32, num_key_value_heads=8,
    vocab_size=128256, rope_theta=500000.0, max_position_embeddings=131072, tie_word_embeddings=False,
    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192})
torch.manual_seed(0)
with torch.device("cuda"):
    m = transformers.LlamaForCausalLM(cfg).to(torch.float16)
for p in m.parameters():
    torch.nn.init.normal_(p, std=0.02) if p.dim() > 1 else torch.nn.init.ones_(p)
m.save_pretrained("/tmp/logit_check", safe_serialization=True)
for mod in m.modules():  # float32 rope frequencies, as the config defines them
    if hasattr(mod, "inv_freq") and hasattr(mod, "config"):
        kind = getattr(mod, "rope_type", "default")
        init = mod.compute_default_rope_parameters if kind == "default" else ROPE_INIT_FUNCTIONS[kind]
        mod.inv_freq = init(mod.config)[0].to("cuda", torch.float32)

ids = np.random.default_rng(0).integers(0, cfg.vocab_size, n_ids)
with torch.no_grad():
    ref16 = m(torch.tensor(ids[None], device="cuda")).logits[0].double().cpu().numpy()
    ref32 = m.float()(torch.tensor(ids[None], device="cuda")).logits[0].double().cpu().numpy()
eng = metalkv.Engine.load("/tmp/logit_check", device="cuda", context=n_ids + 16, progress=False)
got = eng.logits(ids).astype(np.float64)
bands = [0, n_ids // 8, n_ids // 4, n_ids // 2, n_ids - 1]
for name, x in (("metalkv", got), ("torch f16", ref16)):
    d = np.abs(x - ref32)
    print(f"{name} vs torch f32: max |diff| {d.max():.4g}, mean {d.mean():.4g}, top-1 agree "
          f"{np.mean(x.argmax(1) == ref32.argmax(1)):.3f}; max |diff| at positions {bands}: "
          f"{np.round(d.max(1)[bands], 4)} (logit std {ref32.std():.3g})")
