"""ops_ref: the PyTorch oracle for the nn ops (common/nn/ops.h).

Generates seeded random inputs for every op, computes outputs and gradients with torch autograd
in float64 from the float32 inputs, and writes one refdump file (refdump.py) that
test_ops_ref.c reads, runs our ops on and compares. Each op follows the Hugging Face / SpecForge
definition the models rely on: RMSNorm as Qwen3RMSNorm, RoPE with rotate_half and an fp32 angle,
GQA by repeat_interleave, an explicit boolean attention mask (fully masked rows give zero), silu *
up, weighted cross-entropy, torch.optim.AdamW.

Usage: /usr/bin/python3 ops_ref.py OUT.bin
"""
import math
import sys

import torch

from refdump import RefDump

torch.manual_seed(1234)
f64 = torch.float64


def rnd(*shape, scale=1.0):
    return (torch.rand(*shape) * 2 - 1) * scale  # float32


def leaf(t):
    return t.to(f64).requires_grad_(True)


def rmsnorm(dump):
    R, C, eps = 37, 96, 1e-6
    x, w, dout = rnd(R, C, scale=3), rnd(C), rnd(R, C)
    xl, wl = leaf(x), leaf(w)
    var = xl.pow(2).mean(-1, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    out = (xl * rstd) * wl
    out.backward(dout.to(f64))
    for k, v in dict(x=x, w=w, dout=dout, eps=torch.tensor([eps]), out=out, rstd=rstd.squeeze(-1),
                     dx=xl.grad, dw=wl.grad).items():
        dump.add("rmsnorm." + k, v)


def linear(dump):
    M, K, N = 33, 64, 48
    x, w, b, dout = rnd(M, K), rnd(N, K), rnd(N), rnd(M, N)
    xl, wl, bl = leaf(x), leaf(w), leaf(b)
    y = torch.nn.functional.linear(xl, wl, bl)
    y.backward(dout.to(f64))
    for k, v in dict(x=x, w=w, b=b, dout=dout, y=y, dx=xl.grad, dw=wl.grad, db=bl.grad).items():
        dump.add("linear." + k, v)


def rope_tables(pos, d, theta):
    # Hugging Face: inv_freq in float32, freqs = pos.float() * inv_freq in float32, cos/sin of it
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    freqs = pos.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return inv_freq, emb.cos().to(f64), emb.sin().to(f64)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope(dump):
    # head_norm_rope: Qwen3's q/k path, a per-head RMSNorm then RoPE (Hugging Face's formulas)
    T, nh, d, theta, eps = 29, 3, 64, 1000000.0, 1e-6
    pos = torch.randint(0, 4096, (T,), dtype=torch.int32)
    pos[0] = 0
    x, w, dout = rnd(T, nh, d, scale=3), rnd(d), rnd(T, nh, d)
    inv_freq, cos, sin = rope_tables(pos, d, theta)
    xl, wl = leaf(x), leaf(w)
    n = xl * torch.rsqrt(xl.pow(2).mean(-1, keepdim=True) + eps) * wl
    out = n * cos[:, None, :] + rotate_half(n) * sin[:, None, :]
    out.backward(dout.to(f64))
    for k, v in dict(x=x, w=w, pos=pos, dout=dout, theta=torch.tensor([theta]),
                     eps=torch.tensor([eps]), inv_freq=inv_freq, out=out, dx=xl.grad,
                     dw=wl.grad).items():
        dump.add("rope." + k, v)


def rope_llama3(dump):
    # Hugging Face _compute_llama3_parameters (Llama 3.1 values), from the fp32 default table
    d, theta, factor, low, high, old_ctx = 128, 500000.0, 8.0, 1.0, 4.0, 8192
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv_freq
    inv_llama = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_llama / factor + smooth * inv_llama
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    inv_llama = torch.where(medium, smoothed, inv_llama)
    dump.add("rope_llama3.params", torch.tensor([d, theta, factor, low, high, old_ctx], dtype=f64))
    dump.add("rope_llama3.inv_freq", inv_llama)


def swiglu(dump):
    R, F = 21, 80
    g, u, dout = rnd(R, F, scale=5), rnd(R, F, scale=2), rnd(R, F)
    gl, ul = leaf(g), leaf(u)
    out = torch.nn.functional.silu(gl) * ul
    out.backward(dout.to(f64))
    for k, v in dict(gate=g, up=u, dout=dout, out=out, dgate=gl.grad, dup=ul.grad).items():
        dump.add("swiglu." + k, v)


def masked_attention(q, k, v, mask):
    """q[Q,H,d], k,v[Tk,Hk,d], mask[Q,Tk] bool -> out[Q,H,d], lse[H,Q] (+inf on empty rows)."""
    H, Hk, d = q.shape[1], k.shape[1], q.shape[2]
    kk = k.repeat_interleave(H // Hk, dim=1)  # GQA: query head h uses kv head h // (H/Hk)
    vv = v.repeat_interleave(H // Hk, dim=1)
    s = torch.einsum("qhd,thd->hqt", q, kk) / math.sqrt(d)
    s = s.masked_fill(~mask[None], float("-inf"))
    empty = ~mask.any(-1)  # [Q]
    m = s.amax(-1, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m)  # exactly 0 where masked
    l = p.sum(-1, keepdim=True)
    out = torch.einsum("hqt,thd->qhd", p / l.clamp_min(1e-300), vv)
    lse = (m + torch.log(l.clamp_min(1e-300))).squeeze(-1)
    lse = torch.where(empty[None].expand_as(lse), torch.full_like(lse, float("inf")), lse)
    return out, lse


def attention_causal(dump):
    lens = [70, 1, 45, 100]
    H, Hk, d = 4, 2, 64
    T = sum(lens)
    off = torch.tensor([0] + list(torch.cumsum(torch.tensor(lens), 0)), dtype=torch.int32)
    q, k, v = rnd(T, H, d, scale=2), rnd(T, Hk, d, scale=2), rnd(T, Hk, d)
    mask = torch.zeros(T, T, dtype=torch.bool)
    for s in range(len(lens)):
        a, b = int(off[s]), int(off[s + 1])
        mask[a:b, a:b] = torch.tril(torch.ones(b - a, b - a, dtype=torch.bool))
    out, _ = masked_attention(q.to(f64), k.to(f64), v.to(f64), mask)
    for k_, v_ in dict(q=q, k=k, v=v, seq_off=off, out=out).items():
        dump.add("attention_causal." + k_, v_)


def attention_block(dump):
    # DFlash training layout: keys [context 0..S-1 | block_0 | ... | block_{n-1}]; block j sees
    # context strictly before its anchor and its own block; keep = 0 blocks see nothing.
    S, nb, B, H, Hk, d = 50, 5, 16, 4, 2, 64
    Q, Tk = nb * B, S + nb * B
    anchors = [10, 0, 49, 25, 3]
    keep = [1, 1, 1, 0, 1]
    spans = torch.zeros(nb, 4, dtype=torch.int32)
    mask = torch.zeros(Q, Tk, dtype=torch.bool)
    for j in range(nb):
        spans[j] = torch.tensor([0, anchors[j], S + j * B, keep[j]])
        if keep[j]:
            mask[j * B:(j + 1) * B, :anchors[j]] = True
            mask[j * B:(j + 1) * B, S + j * B:S + (j + 1) * B] = True
    q, k, v, dout = rnd(Q, H, d, scale=2), rnd(Tk, Hk, d, scale=2), rnd(Tk, Hk, d), rnd(Q, H, d)
    ql, kl, vl = leaf(q), leaf(k), leaf(v)
    out, lse = masked_attention(ql, kl, vl, mask)
    out.backward(dout.to(f64))
    for k_, v_ in dict(q=q, k=k, v=v, spans=spans, dout=dout, out=out, lse=lse, dq=ql.grad,
                       dk=kl.grad, dv=vl.grad).items():
        dump.add("attention_block." + k_, v_)


def lm_head_xent(dump):
    Q, D, V, chunk, inv_norm = 40, 64, 1000, 16, 0.05
    h, W = rnd(Q, D, scale=2), rnd(V, D)
    labels = torch.randint(0, V, (Q,), dtype=torch.int32)
    weights = torch.rand(Q)
    weights[[3, 17, 18, 39]] = 0.0
    hl = leaf(h)
    logits = hl @ W.to(f64).t()
    ce = torch.nn.functional.cross_entropy(logits, labels.long(), reduction="none")
    w64 = weights.to(f64)
    loss_sum = (w64 * ce).sum()
    (loss_sum * inv_norm).backward()
    am = logits.argmax(-1)
    correct = (am == labels.long()).to(torch.int32)
    sums = torch.stack([loss_sum.detach(), w64[w64 > 0].sum()])
    for k_, v_ in dict(h=h, W=W, labels=labels, weights=weights, chunk=torch.tensor([chunk]),
                       inv_norm=torch.tensor([inv_norm]), dh=hl.grad, sums=sums, correct=correct,
                       argmax=am.to(torch.int32)).items():
        dump.add("lm_head_xent." + k_, v_)


def adamw(dump):
    n, steps = 300, 3
    lr, b1, b2, eps, wd, gscale = 1e-2, 0.9, 0.95, 1e-8, 0.1, 0.5
    p0 = rnd(n)
    grads = rnd(steps, n, scale=3)
    p = p0.clone().to(f64).requires_grad_(True)
    opt = torch.optim.AdamW([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    for s in range(steps):
        p.grad = grads[s].to(f64) * gscale
        opt.step()
    st = opt.state[p]
    for k_, v_ in dict(p0=p0, grads=grads, hyper=torch.tensor([lr, b1, b2, eps, wd, gscale]),
                       p=p.detach(), m=st["exp_avg"], v=st["exp_avg_sq"]).items():
        dump.add("adamw." + k_, v_)


def embedding(dump):
    V, D, T = 50, 24, 17
    table = rnd(V, D)
    ids = torch.randint(0, V, (T,), dtype=torch.int32)
    dump.add("embedding.table", table)
    dump.add("embedding.ids", ids)
    dump.add("embedding.out", table[ids.long()])


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: ops_ref.py OUT.bin")
    dump = RefDump()
    for fn in (rmsnorm, linear, rope, rope_llama3, swiglu, attention_causal, attention_block,
               lm_head_xent, adamw, embedding):
        fn(dump)
    dump.write(sys.argv[1])
    print("ops_ref: wrote %d tensors to %s" % (len(dump.tensors), sys.argv[1]))


if __name__ == "__main__":
    main()
