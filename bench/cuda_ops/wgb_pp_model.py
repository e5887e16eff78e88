#!/usr/bin/env python3
# wgb_pp_model.py: a model of the mbarrier protocol of step_pp (k_wgb_fused's PP and PP3,
# common/nn/ops_cuda_attn_wgbwd.cu), written on a CPU when no GPU was lent: two warpgroup actors
# run a piece's visits with the code's stage (i % NST), dS^T buffer (i % 2), barrier (bar[st],
# visit done bar[NST + p], dS^T in bar[NST + 2 + p]) and parity (ph) arithmetic; warpgroup 1
# issues the loads (PP: visit i + 1 into 1 - st; PP3: visit i + 2 into (st + 2) % 3, after visit
# i - 1 is done), which land after random delays. It asserts that no load overwrites a stage a
# visit still reads, that every visit reads its own data, that no dS^T store overwrites a buffer
# the other dQ still reads and that dQ reads both warpgroups' dS^T, and it fails on a deadlock;
# several pieces run back to back with ph carried over, over 3000 random interleavings each.
# Usage: python3 bench/cuda_ops/wgb_pp_model.py (prints "NST 2 ok", "NST 3 ok"). Mutations tried
# (each fails): PP3 loading into (st + 1) % 3, loading without waiting for visit i - 1, the
# prologue not loading visit 1. A model of the indices, not of the compiled code. PP3 was
# dropped after its H200 timing (2026-12-01: no faster; NOTES.md); NST 3 still models its design.
import random

class MB:
    def __init__(s, count): s.count, s.pending, s.phase = count, count, 0
    def arrive(s):
        s.pending -= 1
        assert s.pending >= 0
        if s.pending == 0: s.phase += 1; s.pending = s.count
    def done(s, parity): return (s.phase & 1) != parity  # phase with this parity completed

def run(NST, seed, pieces):
    rnd = random.Random(seed)
    bar = [MB(1) for _ in range(NST)] + [MB(2) for _ in range(4)]  # stage: 1 arrival = the copy
    BD, BS = NST, NST + 2
    stage_vis = [None] * NST        # visit whose data the stage holds (None: loading/empty)
    stage_readers = [set() for _ in range(NST)]
    dsbuf = [dict(vis=None, writers=set(), readers=set()) for _ in range(2)]
    inflight = []                   # (time, stage, visit)
    now = [0]
    ph = [0, 0]
    log = []
    def load(stg, v):
        assert not stage_readers[stg], ("load over a stage in use", stg, v, stage_readers[stg])
        stage_vis[stg] = None
        inflight.append((now[0] + rnd.randint(1, 40), stg, v))
    def actor(w, n_vis):
        # prologue (after wgb_list): wg1 loads visit 0 (and 1 with NST 3); then __syncthreads
        if w == 1 and n_vis > 0:
            load(0, 0)
            if NST == 3 and n_vis > 1: load(1, 1)
        yield 'sync'
        prev = None
        for i in range(n_vis):
            st = i % NST; p = st if NST == 2 else i % 2
            while not bar[st].done((ph[w] >> st) & 1): yield 'wait'
            ph[w] ^= 1 << st
            assert stage_vis[st] == i, ("stage", st, "holds", stage_vis[st], "visit", i)
            stage_readers[st].add(w)
            yield 'run'
            vp = BD + (1 - p)
            if w == 1:
                ld, ls = (i + 1, 1 - st) if NST == 2 else (i + 2, (st + 2) % 3)
                if ld < n_vis:
                    if i > 0:
                        while not bar[vp].done((ph[w] >> vp) & 1): yield 'wait'
                    load(ls, ld)
            yield 'run'
            if i > 0:
                while not bar[vp].done((ph[w] >> vp) & 1): yield 'wait'
                ph[w] ^= 1 << vp
            b = dsbuf[p]
            assert not b['readers'], ("dS store over a buffer being read", p, i, b)
            if b['vis'] != i: b['vis'], b['writers'] = i, set()
            b['writers'].add(w)
            bar[BS + p].arrive()
            yield 'run'
            if i > 0:
                q = BS + 1 - p
                while not bar[q].done((ph[w] >> q) & 1): yield 'wait'
                ph[w] ^= 1 << q
                o = dsbuf[1 - p]
                assert o['vis'] == i - 1 and o['writers'] == {0, 1}, ("dQ reads", o, i)
                o['readers'].add(w)
            yield 'run'   # wgmma in flight; wait<0>
            stage_readers[st].discard(w)
            if i > 0: dsbuf[1 - p]['readers'].discard(w)
            bar[BD + p].arrive()
            yield 'run'
        if n_vis > 0:
            lb = (n_vis - 1) % 2
            while not bar[BS + lb].done((ph[w] >> (BS + lb)) & 1): yield 'wait'
            ph[w] ^= 1 << (BS + lb)
            ph[w] ^= 1 << (BD + lb)
        yield 'sync'
    for pc in range(pieces):
        n_vis = rnd.choice([0, 1, 2, 3, 4, 5, 7, 8, 13])
        acts = [actor(0, n_vis), actor(1, n_vis)]
        state = ['run', 'run']
        steps = 0
        while True:
            # deliver copies
            for t in [x for x in inflight if x[0] <= now[0]]:
                inflight.remove(t); stage_vis[t[1]] = t[2]; bar[t[1]].arrive()
            live = [k for k in range(2) if state[k] not in ('sync', 'end')]
            if not live:
                if all(s == 'sync' for s in state):
                    # __syncthreads: both reached a sync point
                    for k in range(2):
                        try: state[k] = next(acts[k])
                        except StopIteration: state[k] = 'end'
                    if all(s == 'end' for s in state): break
                    continue
                if all(s in ('sync', 'end') for s in state) and 'end' in state:
                    assert all(s == 'end' for s in state), state
                    break
            k = rnd.choice(live) if live else None
            now[0] += 1
            steps += 1
            assert steps < 100000, "deadlock"
            if k is None: continue
            try: state[k] = next(acts[k])
            except StopIteration: state[k] = 'end'
        assert not inflight
    return True

for NST in (2, 3):
    for seed in range(3000):
        run(NST, seed, 6)
    print("NST", NST, "ok")
