#!/usr/bin/env python3
"""make_checkpoint: writes a random Qwen3-8B-shaped checkpoint (Hugging Face layout: config.json,
sharded model.safetensors + index, bf16) in seconds by drawing the tensors on the GPU. Same
layout and init as `dflash-mkmodel --preset qwen3-8b` (linears and embeddings N(0, 0.02), norms
1), which is single-threaded (~27M parameters/s on the build machine: ~5 minutes for 8B) and so
does not fit a short GPU session. Usage: make_checkpoint.py OUT_DIR [--layers 36]
"""
import argparse
import json
import os

import torch
from safetensors.torch import save_file

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--layers", type=int, default=36)
a = ap.parse_args()
D, F, H, HK, HD, V = 4096, 12288, 32, 8, 128, 151936
os.makedirs(a.out, exist_ok=True)
cfg = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": D,
    "intermediate_size": F, "num_hidden_layers": a.layers, "num_attention_heads": H,
    "num_key_value_heads": HK, "head_dim": HD, "vocab_size": V, "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": False,
    "hidden_act": "silu", "attention_bias": False, "torch_dtype": "bfloat16",
}
json.dump(cfg, open(os.path.join(a.out, "config.json"), "w"), indent=2)
g = torch.Generator(device="cuda").manual_seed(1)


def rnd(*shape):
    return (torch.randn(*shape, device="cuda", generator=g, dtype=torch.float32) * 0.02).to(
        torch.bfloat16).cpu()


def ones(n):
    return torch.ones(n, dtype=torch.bfloat16)


shards, cur = [], {}
cur["model.embed_tokens.weight"] = rnd(V, D)
cur["lm_head.weight"] = rnd(V, D)
cur["model.norm.weight"] = ones(D)
shards.append(cur)
cur = {}
for l in range(a.layers):
    p = f"model.layers.{l}."
    cur[p + "self_attn.q_proj.weight"] = rnd(H * HD, D)
    cur[p + "self_attn.k_proj.weight"] = rnd(HK * HD, D)
    cur[p + "self_attn.v_proj.weight"] = rnd(HK * HD, D)
    cur[p + "self_attn.o_proj.weight"] = rnd(D, H * HD)
    cur[p + "self_attn.q_norm.weight"] = ones(HD)
    cur[p + "self_attn.k_norm.weight"] = ones(HD)
    cur[p + "mlp.gate_proj.weight"] = rnd(F, D)
    cur[p + "mlp.up_proj.weight"] = rnd(F, D)
    cur[p + "mlp.down_proj.weight"] = rnd(D, F)
    cur[p + "input_layernorm.weight"] = ones(D)
    cur[p + "post_attention_layernorm.weight"] = ones(D)
    if (l + 1) % 8 == 0 or l + 1 == a.layers:
        shards.append(cur)
        cur = {}
wmap, total = {}, 0
n = len(shards)
for i, sh in enumerate(shards):
    name = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
    save_file(sh, os.path.join(a.out, name), metadata={"format": "pt"})
    for k, t in sh.items():
        wmap[k] = name
        total += t.numel() * 2
json.dump({"metadata": {"total_size": total}, "weight_map": wmap},
          open(os.path.join(a.out, "model.safetensors.index.json"), "w"), indent=2)
print(f"wrote {a.out}: {a.layers} layers, {total / 1e9:.2f} GB in {n} shards")
