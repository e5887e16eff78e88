#!/usr/bin/env python3
"""hf_target_bench: Hugging Face transformers doing the target's job of bench-target on the
same sequence lengths: bf16, sdpa attention, output_hidden_states, the hidden states of layers
1, 9, 17, 25, 33 (hidden_states[k + 1]) gathered into one [tokens, 5*D] tensor per batch like a
slot. Sequences are bucketed (bucket = length rounded up to a multiple of 512), right-padded with
an attention mask, and batched up to BUDGET padded tokens per forward. The model is loaded with
num_hidden_layers = 34 so it stops after layer 33 (the final norm on layer 33 is the only extra).

Timing: one untimed pass over all batches, then 3 timed passes (torch.cuda.synchronize), the
median. tokens/s counts real tokens; FLOPs and MFU use bench-target's formula on real tokens
(padding is not counted as useful work) and the peak that bench-target measured in the same run.
Last line: RESULT tokens_per_s=... mfu=... peak_gib=...
"""
import argparse
import statistics
import time

import torch
import transformers

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("lengths")
ap.add_argument("--budget", type=int, default=16384)
ap.add_argument("--peak-tflops", type=float, default=0.0)
ap.add_argument("--bucket", type=int, default=512)
a = ap.parse_args()

lens = [int(x) for x in open(a.lengths).read().split()]
cfg = transformers.AutoConfig.from_pretrained(a.model)
cfg.num_hidden_layers = 34
t0 = time.time()
try:
    model = transformers.AutoModel.from_pretrained(
        a.model, config=cfg, dtype=torch.bfloat16, attn_implementation="sdpa", device_map="cuda")
except Exception as e:
    print(f"device_map load failed ({type(e).__name__}: {e}); loading on the host")
    model = transformers.AutoModel.from_pretrained(
        a.model, config=cfg, dtype=torch.bfloat16, attn_implementation="sdpa").cuda()
model.eval()
print(f"transformers {transformers.__version__}, torch {torch.__version__}: loaded "
      f"{type(model).__name__} with {cfg.num_hidden_layers} layers in {time.time() - t0:.1f} s")
D, H, Hk = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
d = getattr(cfg, "head_dim", None) or D // H
F = cfg.intermediate_size
per_tok = 2.0 * (D * H * d + 2 * D * Hk * d + H * d * D + 3 * D * F)
flop = sum(34 * (per_tok * L + 4.0 * H * d * L * (L + 1) / 2) for L in lens)

buckets = {}
for L in lens:
    b = -(-L // a.bucket) * a.bucket
    buckets.setdefault(b, []).append(L)
batches = []
g = torch.Generator().manual_seed(1)
for b, ls in sorted(buckets.items()):
    per = max(1, a.budget // b)
    for i in range(0, len(ls), per):
        chunk = ls[i:i + per]
        ids = torch.randint(0, 151000, (len(chunk), b), generator=g)
        mask = torch.zeros(len(chunk), b, dtype=torch.long)
        for r, L in enumerate(chunk):
            mask[r, :L] = 1
        batches.append((ids.cuda(), mask.cuda()))
padded = sum(x[0].numel() for x in batches)
print(f"{len(lens)} sequences, {sum(lens)} tokens, {len(batches)} batches, {padded} padded tokens "
      f"({100.0 * sum(lens) / padded:.1f}% real)")
capture = [2, 10, 18, 26, 34]


def one_pass():
    for ids, mask in batches:
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
        hs = out.hidden_states
        sel = torch.cat([hs[k] for k in capture], dim=-1)  # [B, L, 5*D] like a slot row
        sel = sel[mask.bool()]  # real tokens only, packed
    torch.cuda.synchronize()


with torch.inference_mode():
    one_pass()
    torch.cuda.reset_peak_memory_stats()
    ts = []
    for _ in range(3):
        t0 = time.time()
        one_pass()
        ts.append(time.time() - t0)
med = statistics.median(ts)
tps = sum(lens) / med
mfu = flop / med / 1e12 / a.peak_tflops if a.peak_tflops > 0 else 0.0
gib = torch.cuda.max_memory_allocated() / 2**30
print(f"transformers: pass {med:.3f} s (median of {' '.join(f'{x:.3f}' for x in ts)}), "
      f"{tps:.0f} tokens/s, {flop / med / 1e12:.1f} TFLOP/s, MFU {100 * mfu:.1f}% of "
      f"{a.peak_tflops:.1f}, peak allocated {gib:.2f} GiB")
print(f"RESULT tokens_per_s={tps:.1f} mfu={mfu:.4f} peak_gib={gib:.2f}")
