#!/usr/bin/env python3
"""torch_drafter_bench: the DFlash training step of tests/reference/dflash_ref.py (same math:
fc + hidden_norm over the target features, noise blocks [anchor token, MASK x 15], KV injection
of the context rows into every layer, per-head q/k norm, RoPE, block mask = context strictly
before the anchor + the own block, decayed cross-entropy over the frozen lm_head), made fast:
bf16 autocast over fp32 master weights, torch.compile of forward + loss, flex_attention with a
block mask (SDPA with a boolean mask when flex_attention is missing), fused AdamW, global-norm
clipping at 1.0. Qwen3-8B drafter: D 4096, 5 layers, H 32 / Hk 8, d 128, F 12288, B 16, V 151936.

Cases as bench-drafter: 1 x 3072 tokens / 512 anchors, 1 x 768 / 256, 4 x 768 / 256 (the four
sequences are run as one packed batch: one block mask over all of them). Anchors are drawn
uniformly (without replacement) each step from positions 64..S-2 and the block mask is rebuilt
every step (inside the timed region). The anchors are drawn on the host, all of them before the
loop (the same draws), into pinned memory, and each step copies its own without a host wait, as
bench-drafter's step does. --anchors-in-step draws each step's anchors in the step and copies
them from pageable memory, a copy that waits for the GPU to finish the step before: the
reference as written until 2026-12-03, which that wait made ~5 ms (3072/512) to ~7 ms (768/256)
slower per step on the H200 (bench/RESULTS.md). --compile-mode picks torch.compile's mode; the
default mode is as fast as any measured: reduce-overhead (CUDA graphs over the compiled forward
and backward) ran 79.3 against 75.1 ms at 768/256 and 186.5 against 149.2 ms at 3072/512;
max-autotune-no-cudagraphs (its autotuning beat cuBLAS on at most one product per run, by
0.3-1.5%, so it was timed with TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS=ATEN; it re-tiles
flex_attention) ran 74.3 and 144.1 ms, within the default mode's spread over boards (73.3-76.8
and 143.0-149.2 ms), after 200-300 s of compilation per case against the default's ~40 s.
Timing: 3 untimed steps (compilation), then --steps (10), torch.cuda.synchronize around them.
FLOPs and MFU: bench-drafter's formula (see its header) with this run's anchors, against
--peak-tflops (bench-drafter's measured peak in the same run); without it, against the peak
this script measures as gemm_peak.h does (an 8192^3 bf16 matmul, best of 3 timings of 10).
Energy: the board's joules per timed step and mean power from NVML's counter (ctypes, as
bench-drafter's energy.h), "energy: n/a" without it. Curve: each timed step's loss and gradient
norm (read after the timed steps), as bench-drafter prints them. --profile-steps N: N more steps
under torch.profiler, then the GPU time per step by kernel group (products: cuBLAS / CUTLASS /
nvjet GEMM kernels; attention: flex_attention's; optimizer; the rest) and the 12 largest
kernels, for the side-by-side with bench-drafter's op profile.
Last lines: RESULT case=... steps_per_s=... samples_per_s=... mfu=... peak_gib=...
"""
import argparse
import math
import sys
import time

import torch
import torch.nn.functional as F

from nvml_energy import nvml_energy

ap = argparse.ArgumentParser()
ap.add_argument("--peak-tflops", type=float, default=0.0)
ap.add_argument("--layers", type=int, default=5)
ap.add_argument("--cases", default="s3072_a512,s768_a256,4xs768_a256")
ap.add_argument("--no-compile", action="store_true")
ap.add_argument("--compile-mode", default="default",
                help="torch.compile's mode for forward + loss: default, reduce-overhead (CUDA "
                     "graphs over the compiled forward and backward), max-autotune-no-cudagraphs")
ap.add_argument("--steps", type=int, default=10, help="timed steps per case")
ap.add_argument("--seed", type=int, default=0,
                help="torch's seed (tables, init); the anchors' generator takes seed + 1")
ap.add_argument("--anchors-in-step", action="store_true",
                help="draw each step's anchors in the step and copy them from pageable memory, "
                     "which waits for the step before (the reference until 2026-12-03); by "
                     "default all are drawn ahead into pinned memory and copied without a wait")
ap.add_argument("--profile-steps", type=int, default=0,
                help="after the timed steps, this many more under torch.profiler: GPU time per "
                     "step by kernel group and the largest kernels")
a = ap.parse_args()
CASES = ("s3072_a512", "s768_a256", "4xs768_a256")  # bench-drafter's, and only those
unknown = [c for c in a.cases.split(",") if c not in CASES]
if unknown:
    ap.error(f"unknown case(s) {', '.join(unknown)}; cases: {', '.join(CASES)}")

try:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    HAVE_FLEX = True
except Exception:  # pragma: no cover
    HAVE_FLEX = False

D, NF, V, H, HK, HD, FF, B, L = 4096, 5, 151936, 32, 8, 128, 12288, 16, a.layers
EPS, THETA, MASK, GAMMA = 1e-6, 1e6, 151669, 7.0
dev = "cuda"
torch.manual_seed(a.seed)


energy_j, power_limit_w = nvml_energy(torch)


def rmsnorm(x, w):
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * w.to(x.dtype)


def rope(x, pos):
    """x [N, heads, d] rotate_half, positions pos [N]."""
    inv = 1.0 / THETA ** (torch.arange(0, HD, 2, device=x.device, dtype=torch.float32) / HD)
    ang = pos.float()[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos()[:, None, :].to(x.dtype), emb.sin()[:, None, :].to(x.dtype)
    rot = torch.cat([-x[..., HD // 2:], x[..., : HD // 2]], -1)
    return x * cos + rot * sin


class Drafter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        lin = lambda o, i: torch.nn.Parameter(torch.randn(o, i, device=dev) * 0.02)
        one = lambda n: torch.nn.Parameter(torch.ones(n, device=dev))
        self.fc = lin(D, NF * D)
        self.hidden_norm, self.norm = one(D), one(D)
        self.layers = torch.nn.ModuleList()
        for _ in range(L):
            m = torch.nn.Module()
            m.q, m.k, m.v, m.o = lin(H * HD, D), lin(HK * HD, D), lin(HK * HD, D), lin(D, H * HD)
            m.gate, m.up, m.down = lin(FF, D), lin(FF, D), lin(D, FF)
            m.in_norm, m.post_norm, m.q_norm, m.k_norm = one(D), one(D), one(HD), one(HD)
            self.layers.append(m)

    def forward(self, X, noise, pos_blk, pos_ctx, embed, lm_head, labels, w, bmask):
        S, Q = X.shape[0], noise.shape[0]
        Ht = rmsnorm(X @ self.fc.T.to(X.dtype), self.hidden_norm)
        h = embed[noise]
        pos_all = torch.cat([pos_ctx, pos_blk])
        for m in self.layers:
            x = rmsnorm(h, m.in_norm)
            q = rope(rmsnorm((x @ m.q.T.to(x.dtype)).view(Q, H, HD), m.q_norm), pos_blk)
            kv_in = torch.cat([Ht, x])
            k = rope(rmsnorm((kv_in @ m.k.T.to(x.dtype)).view(S + Q, HK, HD), m.k_norm), pos_all)
            v = (kv_in @ m.v.T.to(x.dtype)).view(S + Q, HK, HD)
            qh, kh, vh = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
            if HAVE_FLEX:
                o = flex_attention(qh, kh, vh, block_mask=bmask, enable_gqa=True)
            else:
                o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=bmask, enable_gqa=True)
            o = o[0].transpose(0, 1).reshape(Q, H * HD)
            h = h + o @ m.o.T.to(x.dtype)
            y = rmsnorm(h, m.post_norm)
            h = h + (F.silu(y @ m.gate.T.to(x.dtype)) * (y @ m.up.T.to(x.dtype))) @ m.down.T.to(x.dtype)
        out = rmsnorm(h, self.norm)
        logits = (out @ lm_head.T).float()
        ce = F.cross_entropy(logits, labels, reduction="none")
        return (w * ce).sum() / w.sum()


KERNEL_GROUPS = (("products", ("gemm", "nvjet", "xmma", "cutlass", "cublas", "sm90_")),
                 ("attention", ("flex", "attention")),
                 ("optimizer", ("adam", "multi_tensor")))


def kernel_group(name):
    low = name.lower()
    for group, keys in KERNEL_GROUPS:
        if any(k in low for k in keys):
            return group
    return "other"


def print_profile(step, n):
    """n steps under torch.profiler; GPU (self) time per step by kernel group and the largest
    kernels."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    kern = []
    for e in prof.key_averages():  # the GPU's own events (kernels, copies, fills), not the ops
        if "CUDA" not in str(getattr(e, "device_type", "")):
            continue
        us = getattr(e, "self_device_time_total", None)
        if us is None:
            us = getattr(e, "self_cuda_time_total", 0.0)
        if us > 0:
            kern.append((us / 1e3 / n, e.count / n, e.key))
    total = sum(k[0] for k in kern)
    groups = {}
    for ms, _, key in kern:
        g = kernel_group(key)
        groups[g] = groups.get(g, 0.0) + ms
    print(f"profile ({n} steps, GPU time per step): {total:.1f} ms; " +
          ", ".join(f"{g} {groups[g]:.1f}" for g in sorted(groups, key=lambda g: -groups[g])),
          flush=True)
    for ms, calls, key in sorted(kern, reverse=True)[:12]:
        print(f"  {ms:8.2f} ms {calls:6.1f} calls  {kernel_group(key):9s} {key[:90]}", flush=True)


def run_case(name, peak, embed, lm_head):
    nseq = 4 if name.startswith("4x") else 1
    S = 3072 if "3072" in name else 768
    N = int(name.split("_a")[1])
    T = nseq * S
    model = Drafter()
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.0, fused=True)
    fwd = model if a.no_compile else torch.compile(model, mode=a.compile_mode)
    X = (torch.rand(T, NF * D, device=dev) * 2 - 1).to(torch.bfloat16)
    ids = ((torch.arange(T, device=dev) * 7919) % 151000).long()
    pos_ctx = torch.cat([torch.arange(S, device=dev)] * nseq)
    seq_start = torch.arange(nseq, device=dev) * S
    Q = nseq * N * B
    off = torch.arange(B, device=dev)
    gen = torch.Generator(device="cpu").manual_seed(a.seed + 1)
    state = {"flop": 0.0}
    # the block mask reads these persistent buffers (updated in place every step), so the mask
    # function stays one object and the compiled graph is not re-traced per step
    anchor_buf = torch.zeros(nseq * N, device=dev, dtype=torch.long)
    begin_buf = torch.zeros(nseq * N, device=dev, dtype=torch.long)

    def mask_mod(b, h, q_idx, kv_idx):
        j = q_idx // B
        ctx_ok = (kv_idx < T) & (kv_idx >= begin_buf[j]) & (kv_idx < anchor_buf[j])
        blk_ok = (kv_idx >= T) & ((kv_idx - T) // B == j)
        return ctx_ok | blk_ok

    def draw_anchors():
        # anchors per sequence, sorted; absolute context row = seq_start + anchor
        return torch.stack([torch.randperm(S - 1 - 64, generator=gen)[:N].sort().values + 64
                            for _ in range(nseq)])  # [nseq, N] on the host

    # the same draws, made before the loop (3 warm-up + timed + profiled) unless --anchors-in-step
    ahead = [] if a.anchors_in_step else \
        [draw_anchors().pin_memory() for _ in range(3 + a.steps + a.profile_steps)]

    def step():
        if a.compile_mode == "reduce-overhead":  # a new step: the last one's graph outputs die
            torch.compiler.cudagraph_mark_step_begin()
        anc_h = draw_anchors() if a.anchors_in_step else ahead.pop(0)
        anc = anc_h.to(dev, non_blocking=not a.anchors_in_step)
        blk_seq = torch.arange(nseq, device=dev).repeat_interleave(N)
        anc_f = anc.reshape(-1)
        abs_anchor = seq_start[blk_seq] + anc_f  # [nb]
        ctx_begin = seq_start[blk_seq]
        noise = torch.full((nseq * N, B), MASK, device=dev, dtype=torch.long)
        noise[:, 0] = ids[abs_anchor]
        noise = noise.reshape(-1)
        pos_blk = (anc_f[:, None] + off[None, :]).reshape(-1)
        t = anc_f[:, None] + off[None, :]
        inside = t < S
        tc = seq_start[blk_seq][:, None] + t.clamp(max=S - 1)
        labels = ids[tc].reshape(-1)
        o = off[None, :].expand_as(t)
        w = (inside & (o >= 1)).float() * torch.exp(-(o - 1).float() / GAMMA)
        w = w.reshape(-1)
        if HAVE_FLEX:
            anchor_buf.copy_(abs_anchor)
            begin_buf.copy_(ctx_begin)
            bm = create_block_mask(mask_mod, None, None, Q, T + Q, device=dev)
        else:
            qj = torch.arange(Q, device=dev) // B
            kv = torch.arange(T + Q, device=dev)
            bm = (((kv[None] < T) & (kv[None] >= ctx_begin[qj][:, None]) &
                   (kv[None] < abs_anchor[qj][:, None])) |
                  ((kv[None] >= T) & ((kv[None] - T) // B == qj[:, None])))
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(X, noise, pos_blk, pos_ctx, embed, lm_head, labels, w, bm)
        loss.backward()
        state["norm"] = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        keys = float((B * (anc_h + B)).sum())
        per_row = D * H * HD + 2 * D * HK * HD + H * HD * D + 3 * D * FF
        state["flop"] += (6.0 * Q * per_row * L + 6.0 * T * 2 * D * HK * HD * L +
                          4.0 * T * NF * D * D + 12.0 * H * HD * keys * L + 4.0 * Q * D * V)
        return loss

    t0 = time.time()
    for _ in range(3):
        loss = step()
    torch.cuda.synchronize()
    warm = time.time() - t0
    torch.cuda.reset_peak_memory_stats()
    state["flop"] = 0.0
    steps = a.steps
    j0 = energy_j() if energy_j else None
    t0 = time.time()
    curve = []  # (loss, grad norm) tensors, read after the timed steps
    for _ in range(steps):
        loss = step()
        curve.append((loss.detach().clone(), state["norm"]))  # graph outputs get reused
    torch.cuda.synchronize()
    sec = (time.time() - t0) / steps
    j1 = energy_j() if energy_j else None
    flop = state["flop"] / steps
    mfu = flop / sec / 1e12 / peak if peak > 0 else 0.0
    gib = torch.cuda.max_memory_allocated() / 2**30
    print(f"{name:16s} {nseq} x {S} tokens, {N} anchors/seq: {sec * 1e3:.1f} ms/step, "
          f"{1 / sec:.2f} steps/s, {nseq / sec:.2f} samples/s, {flop / sec / 1e12:.1f} TFLOP/s, "
          f"MFU {100 * mfu:.1f}%, peak allocated {gib:.2f} GiB, loss {loss.item():.3f} "
          f"(warm-up incl. compile {warm:.0f} s)", flush=True)
    print(f"RESULT case={name} steps_per_s={1 / sec:.3f} samples_per_s={nseq / sec:.3f} "
          f"mfu={mfu:.4f} peak_gib={gib:.2f}", flush=True)
    print("curve (loss/grad norm per timed step): " +
          " ".join(f"{l.item():.3f}/{n.item():.2f}" for l, n in curve), flush=True)
    if j0 is None or j1 is None:
        print("energy: n/a", flush=True)
    else:
        print(f"energy: {(j1 - j0) / steps:.2f} J/step, {(j1 - j0) / (steps * sec):.0f} W mean "
              f"over the timed steps (board limit {power_limit_w:.0f} W)", flush=True)
    if a.profile_steps > 0:
        print_profile(step, a.profile_steps)
    del model, opt, fwd
    torch.cuda.empty_cache()


print(f"torch {torch.__version__}, attention: "
      f"{'flex_attention + block mask' if HAVE_FLEX else 'SDPA + boolean mask'}, "
      f"{'eager' if a.no_compile else 'torch.compile, mode ' + a.compile_mode}", flush=True)
embed = (torch.randn(V, D, device=dev) * 0.05).to(torch.bfloat16)
lm_head = (torch.randn(V, D, device=dev) * 0.02).to(torch.bfloat16)
def measured_peak_tflops():
    """gemm_peak.h's measurement in torch: 8192^3 bf16 matmul, 3 warm-ups, best of 3 x 10."""
    n = 8192
    x = torch.rand(n, n, device=dev).sub_(0.5).to(torch.bfloat16)
    w = torch.rand(n, n, device=dev).sub_(0.5).to(torch.bfloat16)
    for _ in range(3):
        y = x @ w.t()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(10):
            y = x @ w.t()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / 10)
    del x, w, y
    return 2.0 * n ** 3 / best / 1e12


peak = a.peak_tflops
if peak <= 0:
    peak = measured_peak_tflops()
    print(f"peak (measured 8192^3 bf16 matmul): {peak:.1f} TFLOP/s", flush=True)
failed = 0
for c in a.cases.split(","):
    try:
        run_case(c, peak, embed, lm_head)
    except Exception as e:  # report and go on with the next case; the exit status says so
        print(f"{c}: FAILED {type(e).__name__}: {str(e)[:400]}", flush=True)
        failed += 1
        torch.cuda.empty_cache()
sys.exit(1 if failed else 0)
