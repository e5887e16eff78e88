#!/usr/bin/env python3
"""target_ref: the PyTorch oracle of the target forward (common/nn/target_model.c), run in CI.

For each family (Qwen3, Qwen2, Llama) it builds a small random configuration, writes it in
Hugging Face layout (config.json + model.safetensors, with the tiny writer below, so neither
transformers nor safetensors is needed), runs a float64 reference forward written from the
HF modelling semantics over several packed sequences of different lengths, and dumps the
inputs, the captured layers and the last-token logits of every sequence. test_target_ref.c
loads each checkpoint through our loader, runs the packed batch and compares.

  target_ref.py DUMP      writes DUMP (refdump.py format) and the checkpoints DUMP.models/<family>/
                          (the three families in F32, then LAYOUTS: the same in real repos' layouts)
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
# which is layer order (target_layer_ids_check_order refuses any other). Qwen3's long sequence
# reaches the positions where its lowest RoPE frequencies turn the keys by a visible angle (at
# 80 positions a table with them zeroed passed).
FAMILIES = {
    "qwen3": (dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=97,
                   hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                   rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=1024,
                   tie_word_embeddings=True, attention_bias=False, hidden_act="silu",
                   torch_dtype="float32", bos_token_id=1, eos_token_id=2),
              [0, 2], [5, 17, 1, 30, 9, 700]),
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


# The same architectures in the layouts real hub repos use, each read back through our loader:
# name -> (family it copies, config changes, layout). Layout: dtype of the weights (the oracle
# runs on the rounded values), shards (> 1: model-0000k-of-0000n.safetensors + index json),
# extra tensors a real file may carry and the model never reads (a rotary inv_freq buffer, a
# BOOL mask). Config changes: the fields real files carry (transformers 5's rope_parameters
# spelling with no top-level rope_theta, dtype, layer_types, Qwen2.5's sliding_window fields with
# use_sliding_window false, a tied file that holds lm_head.weight anyway, which HF ignores).
LAYOUTS = {
    "qwen3_bf16_shards": ("qwen3", dict(torch_dtype=None, dtype="bfloat16", sliding_window=None,
                                        use_sliding_window=False, max_window_layers=4,
                                        layer_types=["full_attention"] * 4),
                          dict(dtype="BF16", shards=3, extra=False)),
    "qwen2_f16_hub": ("qwen2", dict(torch_dtype="float16", sliding_window=32768,
                                    max_window_layers=2, use_sliding_window=False,
                                    tie_word_embeddings=True),
                      dict(dtype="F16", shards=1, extra=True)),
    "llama_v5": ("llama", dict(rope_theta=None, rope_scaling=None, torch_dtype=None,
                               dtype="bfloat16", tie_word_embeddings=True,
                               rope_parameters=dict(rope_type="llama3", rope_theta=500000.0,
                                                    factor=8.0, low_freq_factor=1.0,
                                                    high_freq_factor=4.0,
                                                    original_max_position_embeddings=32)),
                 dict(dtype="BF16", shards=2, extra=True, lm_head_anyway=True)),
}


def layout_config(base, changes):
    cfg = dict(base)
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    return cfg


def rope_params(cfg):
    """theta and the scaling block, from either spelling (rope_parameters: transformers 5)."""
    rp = cfg.get("rope_parameters") or {}
    return cfg.get("rope_theta", rp.get("rope_theta", 10000.0)), cfg.get("rope_scaling") or rp


def head_dim(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def tensor_bytes(torch, t, dtype):
    """t's little-endian bytes in a safetensors dtype (F32, BF16, F16, BOOL)."""
    t = t.detach().to("cpu").contiguous()
    if dtype == "BF16":
        return t.float().to(torch.bfloat16).view(torch.int16).numpy().astype("<i2").tobytes()
    if dtype == "F16":
        return t.float().numpy().astype("<f2").tobytes()
    if dtype == "BOOL":
        return t.to(torch.uint8).numpy().tobytes()
    return t.float().numpy().astype("<f4").tobytes()


def write_safetensors(torch, path, tensors):
    """tensors: list of (name, torch tensor, safetensors dtype). Returns the data bytes."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t, dtype in tensors:
        data = tensor_bytes(torch, t, dtype)
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    return off


def write_checkpoint(torch, d, weights, layout):
    """The weights (name, float tensor) in the layout's dtype, shards and extras."""
    dtype, shards = layout.get("dtype", "F32"), layout.get("shards", 1)
    tensors = [(n, t, dtype) for n, t in weights]
    if layout.get("extra"):
        tensors.append(("model.rotary_emb.inv_freq", 1.0 / torch.arange(1, 9).float(), "F32"))
        tensors.append(("model.layers.0.self_attn.causal_mask", torch.ones(4, 4).tril(), "BOOL"))
    if layout.get("lm_head_anyway"):  # tied, but the file holds one (HF ties it to the embedding)
        tensors.append(("lm_head.weight", -weights[0][1], dtype))
    if shards == 1:
        write_safetensors(torch, os.path.join(d, "model.safetensors"), tensors)
        return
    weight_map, total = {}, 0
    for k in range(shards):
        fname = "model-%05d-of-%05d.safetensors" % (k + 1, shards)
        part = tensors[k::shards]
        total += write_safetensors(torch, os.path.join(d, fname), part)
        weight_map.update({n: fname for n, _, _ in part})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def rounded(torch, t, dtype):
    """What the file holds of t, back in float64."""
    if dtype == "BF16":
        return t.float().to(torch.bfloat16).double()
    if dtype == "F16":
        return t.float().half().double()
    return t.double()


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
    theta, rs = rope_params(cfg)
    f = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
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
    cases = [(fam, cfg, ids, lens, {}) for fam, (cfg, ids, lens) in FAMILIES.items()]
    for name, (base, changes, layout) in LAYOUTS.items():
        cfg, ids, lens = FAMILIES[base]
        cases.append((name, layout_config(cfg, changes), ids, lens, layout))
    for fi, (fam, cfg, layer_ids, lengths, layout) in enumerate(cases):
        d = os.path.join(args.dump + ".models", fam)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
        weights = random_weights(torch, cfg, args.seed + fi)
        write_checkpoint(torch, d, weights, layout)
        W = {n: rounded(torch, t, layout.get("dtype", "F32")) for n, t in weights}
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
        print("%s: %d layers, %d tokens in %d sequences, captured %s%s" %
              (fam, cfg["num_hidden_layers"], seq_off[-1], len(lengths), layer_ids,
               " (%s, %d shard(s))" % (layout["dtype"], layout["shards"]) if layout else ""))
    dump.write(args.dump)
    return 0


if __name__ == "__main__":
    sys.exit(main())
