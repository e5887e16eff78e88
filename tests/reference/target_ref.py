#!/usr/bin/env python3
"""target_ref: the PyTorch oracle of the target forward (common/nn/target_model.c), run in CI.

For each family (Qwen3, Qwen2, Llama) it builds a small random configuration, writes it in
Hugging Face layout (config.json + model.safetensors, with the tiny writer below, so neither
transformers nor safetensors is needed), runs a float64 reference forward written from the
HF modelling semantics over several packed sequences of different lengths, and dumps the
inputs, the captured layers and the last-token logits of every sequence. test_target_ref.c
loads each checkpoint through our loader, runs the packed batch and compares.

  target_ref.py DUMP      writes DUMP (refdump.py format) and the checkpoints DUMP.models/<family>/
Run by run_reference.sh (which skips the test when torch is absent). Tensors in DUMP, per family:
  <fam>.seq_off  i32 [n_seqs + 1]      <fam>.ids, <fam>.pos  i32 [T]
  <fam>.layer_ids i32 [n]              captured ids, in column order
  <fam>.hidden   f32 [T, n * D]        column block j = output of decoder layer layer_ids[j]
                                       (HF output_hidden_states[layer_ids[j] + 1])
  <fam>.logits   f32 [n_seqs, V]       final norm + lm_head at each sequence's last token
"""
import argparse
import json
import math
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# family -> (config.json, captured layer ids, sequence lengths). Column order is list order,
# which is layer order (target_layer_ids_check_order refuses any other).
FAMILIES = {
    "qwen3": (dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=97,
                   hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                   rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=256,
                   tie_word_embeddings=True, attention_bias=False, hidden_act="silu",
                   torch_dtype="float32", bos_token_id=1, eos_token_id=2),
              [0, 2], [5, 17, 1, 30, 9]),
    "qwen2": (dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", vocab_size=89,
                   hidden_size=64, intermediate_size=112, num_hidden_layers=3,
                   num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
                   rope_theta=10000.0, max_position_embeddings=256, tie_word_embeddings=False,
                   hidden_act="silu", torch_dtype="float32", bos_token_id=1, eos_token_id=2),
              [1], [12, 3, 25, 8]),
    "llama": (dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=101,
                   hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                   rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=512,
                   rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                     high_freq_factor=4.0, original_max_position_embeddings=32),
                   tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                   hidden_act="silu", torch_dtype="float32", bos_token_id=1, eos_token_id=2),
              [0, 1, 3], [40, 2, 19, 7, 11]),
}


def head_dim(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def write_safetensors(path, tensors):
    """tensors: list of (name, float32 numpy-compatible torch tensor). Writes F32 safetensors."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors:
        data = t.detach().to("cpu").contiguous().float().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def random_weights(torch, cfg, seed):
    """HF-named float32 tensors: unit-variance-preserving linears, jittered norms, biases."""
    g = torch.Generator().manual_seed(seed)
    D, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    d, H, Hk = head_dim(cfg), cfg["num_attention_heads"], cfg["num_key_value_heads"]

    def lin(n, k):
        return torch.randn(n, k, generator=g) / math.sqrt(k)

    def norm(n):
        return 1.0 + 0.1 * torch.randn(n, generator=g)

    def bias(n):
        return 0.1 * torch.randn(n, generator=g)

    w = [("model.embed_tokens.weight", torch.randn(V, D, generator=g))]
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        w.append((p + "input_layernorm.weight", norm(D)))
        w.append((p + "self_attn.q_proj.weight", lin(H * d, D)))
        w.append((p + "self_attn.k_proj.weight", lin(Hk * d, D)))
        w.append((p + "self_attn.v_proj.weight", lin(Hk * d, D)))
        if cfg["model_type"] == "qwen2":
            w.append((p + "self_attn.q_proj.bias", bias(H * d)))
            w.append((p + "self_attn.k_proj.bias", bias(Hk * d)))
            w.append((p + "self_attn.v_proj.bias", bias(Hk * d)))
        if cfg["model_type"] == "qwen3":
            w.append((p + "self_attn.q_norm.weight", norm(d)))
            w.append((p + "self_attn.k_norm.weight", norm(d)))
        w.append((p + "self_attn.o_proj.weight", lin(D, H * d)))
        w.append((p + "post_attention_layernorm.weight", norm(D)))
        w.append((p + "mlp.gate_proj.weight", lin(F, D)))
        w.append((p + "mlp.up_proj.weight", lin(F, D)))
        w.append((p + "mlp.down_proj.weight", lin(D, F)))
    w.append(("model.norm.weight", norm(D)))
    if not cfg["tie_word_embeddings"]:
        w.append(("lm_head.weight", lin(V, D)))
    return w


def inv_freq(torch, cfg):
    """HF default RoPE frequencies, with the Llama-3 rule when rope_scaling says llama3."""
    d = head_dim(cfg)
    f = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    rs = cfg.get("rope_scaling")
    if rs and rs.get("rope_type", rs.get("type")) == "llama3":
        old = rs["original_max_position_embeddings"]
        low_wl, high_wl = old / rs["low_freq_factor"], old / rs["high_freq_factor"]
        wl = 2 * math.pi / f
        scaled = torch.where(wl > low_wl, f / rs["factor"], f)
        smooth = (old / wl - rs["low_freq_factor"]) / (rs["high_freq_factor"] - rs["low_freq_factor"])
        smoothed = (1 - smooth) * scaled / rs["factor"] + smooth * scaled
        medium = (wl >= high_wl) & (wl <= low_wl)
        f = torch.where(medium, smoothed, scaled)
    return f


def rmsnorm(torch, x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(torch, x, pos, f):
    """x [S, n, d], rotate_half layout."""
    ang = pos[:, None].double() * f[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
    h = x.shape[-1] // 2
    rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
    return x * cos + rot * sin


def forward_one(torch, cfg, W, ids, pos):
    """One sequence, float64. Returns (hidden states after each layer [L][S, D], final logits)."""
    H, Hk, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim(cfg)
    eps, S, f = cfg["rms_norm_eps"], len(ids), inv_freq(torch, cfg)
    g = lambda n: W[n]
    b = lambda n: W[n] if n in W else 0.0
    h = g("model.embed_tokens.weight")[ids]
    mask = torch.full((S, S), float("-inf"), dtype=torch.float64).triu(1)
    outs = []
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        x = rmsnorm(torch, h, g(p + "input_layernorm.weight"), eps)
        q = (x @ g(p + "self_attn.q_proj.weight").T + b(p + "self_attn.q_proj.bias")).view(S, H, d)
        k = (x @ g(p + "self_attn.k_proj.weight").T + b(p + "self_attn.k_proj.bias")).view(S, Hk, d)
        v = (x @ g(p + "self_attn.v_proj.weight").T + b(p + "self_attn.v_proj.bias")).view(S, Hk, d)
        if cfg["model_type"] == "qwen3":
            q = rmsnorm(torch, q, g(p + "self_attn.q_norm.weight"), eps)
            k = rmsnorm(torch, k, g(p + "self_attn.k_norm.weight"), eps)
        q, k = rope(torch, q, pos, f), rope(torch, k, pos, f)
        k = k.repeat_interleave(H // Hk, dim=1)
        v = v.repeat_interleave(H // Hk, dim=1)
        a = torch.einsum("shd,thd->hst", q, k) / math.sqrt(d) + mask
        a = torch.einsum("hst,thd->shd", a.softmax(-1), v).reshape(S, H * d)
        h = h + a @ g(p + "self_attn.o_proj.weight").T
        y = rmsnorm(torch, h, g(p + "post_attention_layernorm.weight"), eps)
        gate, up = y @ g(p + "mlp.gate_proj.weight").T, y @ g(p + "mlp.up_proj.weight").T
        h = h + (torch.nn.functional.silu(gate) * up) @ g(p + "mlp.down_proj.weight").T
        outs.append(h)
    lm = W.get("lm_head.weight", W["model.embed_tokens.weight"])
    logits = rmsnorm(torch, h, g("model.norm.weight"), eps) @ lm.T
    return outs, logits


def packed_inputs(torch, cfg, lengths, seed):
    g = torch.Generator().manual_seed(seed)
    seq_off = [0]
    for n in lengths:
        seq_off.append(seq_off[-1] + n)
    ids = torch.randint(0, cfg["vocab_size"], (seq_off[-1],), generator=g)
    pos = torch.cat([torch.arange(n) for n in lengths])
    return seq_off, ids, pos


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dump", help="refdump file to write; checkpoints go to DUMP.models/")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    import torch
    from refdump import RefDump
    torch.set_num_threads(1)
    dump = RefDump()
    for fi, (fam, (cfg, layer_ids, lengths)) in enumerate(FAMILIES.items()):
        d = os.path.join(args.dump + ".models", fam)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
        weights = random_weights(torch, cfg, args.seed + fi)
        write_safetensors(os.path.join(d, "model.safetensors"), weights)
        W = {n: t.double() for n, t in weights}
        seq_off, ids, pos = packed_inputs(torch, cfg, lengths, args.seed + 100 + fi)
        hid, logits = [], []
        for s in range(len(lengths)):
            a, b = seq_off[s], seq_off[s + 1]
            outs, lg = forward_one(torch, cfg, W, ids[a:b], pos[a:b])
            hid.append(torch.cat([outs[k] for k in layer_ids], dim=-1))
            logits.append(lg[-1])
        dump.add(fam + ".seq_off", torch.tensor(seq_off, dtype=torch.int32))
        dump.add(fam + ".ids", ids.int())
        dump.add(fam + ".pos", pos.int())
        dump.add(fam + ".layer_ids", torch.tensor(layer_ids, dtype=torch.int32))
        dump.add(fam + ".hidden", torch.cat(hid).float())
        dump.add(fam + ".logits", torch.stack(logits).float())
        print("%s: %d layers, %d tokens in %d sequences, captured %s" %
              (fam, cfg["num_hidden_layers"], seq_off[-1], len(lengths), layer_ids))
    dump.write(args.dump)
    return 0


if __name__ == "__main__":
    sys.exit(main())
