#!/usr/bin/env python3
"""torch_matmul_probe: PyTorch's bf16 products (torch's own cuBLAS picks) at bench-cuda_ops'
linear rows, cool and at the board's power limit, to set beside `BENCH_ENERGY_S=S bench-cuda_ops`
(our cuBLASLt picks) in the same device call: at the limit a product's time is its joules over
the limit, so the J per call of the two says whose kernels cost less energy per FLOP.

Rows (M rows, K in, N out; w [N, K], y = x w^T as F.linear): q/o 8192 x 4096 -> 4096, gate/up
8192 x 4096 -> 12288, down 8192 x 12288 -> 4096, fc 3072 x 20480 -> 4096, and the backward of
gate/up and down (dx = dy w, then dw += dy^T x: bench-cuda_ops' linear_bwd mode 0 adds into dw).
Inputs: x uniform in [-1, 1), w in [-0.02, 0.02), dy in [-1, 1), as bench-cuda_ops draws them.
Timing: 2 untimed calls, then the median of 3 batches of 10 between synchronisations (cool);
then batches of 10 for at least --seconds (the limit), with NVML's joules over that window.
Usage: torch_matmul_probe.py [--seconds 1.5]
"""
import argparse
import statistics
import time

import torch

from nvml_energy import nvml_energy

ROWS = (("linear_fwd q/o", 8192, 4096, 4096, False),
        ("linear_fwd gate/up", 8192, 4096, 12288, False),
        ("linear_fwd down", 8192, 12288, 4096, False),
        ("linear_fwd fc", 3072, 20480, 4096, False),
        ("linear_bwd gate/up", 8192, 4096, 12288, True),
        ("linear_bwd down", 8192, 12288, 4096, True))


def uniform(shape, scale):
    return ((torch.rand(shape, device="cuda") * 2 - 1) * scale).to(torch.bfloat16)


def batch_ms(fn, n=10):
    torch.cuda.synchronize()
    t0 = time.time()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.time() - t0) * 1e3 / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=1.5)
    a = ap.parse_args()
    joules, limit_w = nvml_energy(torch)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, power limit "
          f"{limit_w:.0f} W", flush=True)
    print(f"{'row':26s} {'shape':34s} {'cool ms':>10s} {'TFLOP/s':>9s} {'limit ms':>9s} "
          f"{'J/call':>9s} {'W':>5s}", flush=True)
    for name, m, k, n, bwd in ROWS:
        x, w = uniform((m, k), 1.0), uniform((n, k), 0.02)
        if bwd:
            dy = uniform((m, n), 1.0)
            dx = torch.empty(m, k, device="cuda", dtype=torch.bfloat16)
            dw = torch.zeros(n, k, device="cuda", dtype=torch.bfloat16)

            def fn():
                torch.mm(dy, w, out=dx)
                dw.addmm_(dy.t(), x)
        else:
            y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)

            def fn():
                torch.mm(x, w.t(), out=y)
        fn(), fn()
        cool = statistics.median(batch_ms(fn) for _ in range(3))
        flop = 2.0 * m * k * n * (2 if bwd else 1)
        calls, j0, t0 = 0, joules() if joules else None, time.time()
        while time.time() - t0 < a.seconds:
            batch_ms(fn)
            calls += 10
        el = time.time() - t0
        j1 = joules() if joules else None
        lim = el * 1e3 / calls
        energy = f"{(j1 - j0) / calls:9.3f} {(j1 - j0) / el:5.0f}" if j0 is not None else "n/a"
        shape = f"M{m} K{k} N{n}{' dx+dw' if bwd else ''}"
        print(f"{name:26s} {shape:34s} {cool:10.3f} {flop / cool / 1e9:9.1f} {lim:9.3f} "
              f"{energy}", flush=True)


if __name__ == "__main__":
    main()
