"""dflash_ref: a PyTorch implementation of the DFlash training step, written from the spec
(reference/dflash.md 1.4, 1.5, 3.1, 3.2), used as the oracle of test_dflash_ref.c.

It builds a tiny drafter and a two-sequence batch, draws the anchors (3.2 step 1-2; dumped so the
C side need not reproduce torch's RNG), runs the forward with an explicit boolean attention mask
(1.5: context strictly before the anchor, the block bidirectional, other blocks invisible),
the decayed cross-entropy normalised by the sum of weights over the whole batch, and backward.
Each sequence is computed on its own (no packing), which checks the C side's packed layout.
Then 10 AdamW steps (torch.optim.AdamW, weight decay on matrices only, global-norm clipping,
warmup + cosine learning rate) on the same batch give the loss trajectory and the parameters
after the steps, each tensor of which the C side compares: a decay dropped from the matrices, or
given to the norm vectors too, moves them by wd x the sum of the 10 rates (6e-3 relative), far
past the float32 noise (2e-6); the loss alone could not see it (audit-tests finding 2).

Everything runs in float64; the dump stores float32. Usage: dflash_ref.py OUT.bin
Also importable: DFlashRef (the model) and its loader, used by dflash_logits_check.py.
"""
import math
import sys

import torch
import torch.nn.functional as F

from refdump import RefDump

torch.set_default_dtype(torch.float64)

LAYER_MATS = ["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
              "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
              "mlp.down_proj.weight"]
LAYER_VECS = ["input_layernorm.weight", "post_attention_layernorm.weight",
              "self_attn.q_norm.weight", "self_attn.k_norm.weight"]


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, pos, theta):
    """x [N, heads, d], rotate_half layout, absolute positions pos [N]."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos.to(torch.float64)[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
    rot = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * cos + rot * sin


class DFlashRef:
    """cfg: dict with D, H, Hk, d, F, L, B, nF, V, mask, eps, theta. params: name -> tensor
    (checkpoint names of dflash.md 2.2). embed, lm_head: [V, D] frozen."""

    def __init__(self, cfg, params, embed, lm_head):
        self.c, self.p, self.embed, self.lm_head = cfg, params, embed, lm_head

    def names(self):
        c = self.c
        n = ["fc.weight"]
        for l in range(c["L"]):
            n += ["layers.%d.%s" % (l, s) for s in LAYER_MATS]
        n += ["hidden_norm.weight", "norm.weight"]
        for l in range(c["L"]):
            n += ["layers.%d.%s" % (l, s) for s in LAYER_VECS]
        return n

    def block_outputs(self, X, ids, anchors):
        """One sequence: X [S, nF*D] features, ids [S], anchors [N] -> final-norm outputs
        [N*B, D] of the blocks (before lm_head)."""
        c, p = self.c, self.p
        S, N, B = X.shape[0], len(anchors), c["B"]
        D, H, Hk, d, eps = c["D"], c["H"], c["Hk"], c["d"], c["eps"]
        Q = N * B
        Ht = rmsnorm(X @ p["fc.weight"].T, p["hidden_norm.weight"], eps)
        noise = torch.full((N, B), c["mask"], dtype=torch.long)
        noise[:, 0] = ids[anchors]
        h = self.embed[noise.reshape(-1)]
        off = torch.arange(B)
        pos_blk = (anchors[:, None] + off[None, :]).reshape(-1)
        pos_all = torch.cat([torch.arange(S), pos_blk])
        # explicit mask [Q, S + Q]
        qblk = torch.arange(Q) // B
        kv = torch.arange(S + Q)
        ctx_ok = (kv[None, :] < S) & (kv[None, :] < anchors[qblk][:, None])
        blk_ok = (kv[None, :] >= S) & (((kv[None, :] - S) // B) == qblk[:, None])
        mask = ctx_ok | blk_ok
        for l in range(c["L"]):
            pre = "layers.%d." % l
            W = lambda s: p[pre + s]
            x = rmsnorm(h, W("input_layernorm.weight"), eps)
            q = (x @ W("self_attn.q_proj.weight").T).view(Q, H, d)
            q = rope(rmsnorm(q, W("self_attn.q_norm.weight"), eps), pos_blk, c["theta"])
            k = torch.cat([Ht, x]) @ W("self_attn.k_proj.weight").T
            v = torch.cat([Ht, x]) @ W("self_attn.v_proj.weight").T
            k = rope(rmsnorm(k.view(S + Q, Hk, d), W("self_attn.k_norm.weight"), eps), pos_all,
                     c["theta"])
            v = v.view(S + Q, Hk, d)
            k = k.repeat_interleave(H // Hk, dim=1)
            v = v.repeat_interleave(H // Hk, dim=1)
            sc = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
            sc = sc.masked_fill(~mask[None], float("-inf"))
            a = torch.einsum("hqk,khd->qhd", torch.softmax(sc, -1), v).reshape(Q, H * d)
            h = h + a @ W("self_attn.o_proj.weight").T
            y = rmsnorm(h, W("post_attention_layernorm.weight"), eps)
            h = h + (F.silu(y @ W("mlp.gate_proj.weight").T) * (y @ W("mlp.up_proj.weight").T)) \
                @ W("mlp.down_proj.weight").T
        return rmsnorm(h, p["norm.weight"], eps)

    def labels_weights(self, ids, lmask, anchors, gamma):
        S, B = ids.shape[0], self.c["B"]
        t = anchors[:, None] + torch.arange(B)[None, :]
        inside = t < S
        tc = t.clamp(max=S - 1)
        o = torch.arange(B)[None, :].expand_as(t)
        w = inside.double() * (o >= 1).double() * lmask[tc].double() * torch.exp(-(o - 1) / gamma)
        w = torch.where(o >= 1, w, torch.zeros_like(w))
        return ids[tc].reshape(-1), w.reshape(-1)

    def loss(self, X, ids, lmask, seq_off, anchors_per_seq, gamma):
        """Sum w*CE / sum w over all sequences of the batch."""
        num, den = 0.0, 0.0
        for s, anc in enumerate(anchors_per_seq):
            if len(anc) == 0:
                continue
            a, b = seq_off[s], seq_off[s + 1]
            out = self.block_outputs(X[a:b], ids[a:b], anc)
            lab, w = self.labels_weights(ids[a:b], lmask[a:b], anc, gamma)
            ce = F.cross_entropy(out @ self.lm_head.T, lab, reduction="none")
            num = num + (w * ce).sum()
            den = den + w.sum()
        return num / den


def lr_at(step, lr, warmup_ratio, total, min_ratio):
    """The schedule of dflash_train_lr: linear warmup (step+1)/W, then cosine to min_ratio*lr."""
    W = int(warmup_ratio * total + 1e-6)  # SpecForge: int(warmup_ratio * total_steps)
    if step < W:
        return lr * (step + 1) / W
    p = min(1.0, (step - W) / (total - W)) if total > W else 1.0
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * p)))


def main(out):
    g = torch.Generator().manual_seed(20260602)
    rn = lambda *s: torch.randn(*s, generator=g)
    cfg = dict(D=32, H=4, Hk=2, d=8, F=48, L=2, B=8, nF=3, V=37, mask=36, eps=1e-6,
               theta=10000.0, num_target_layers=8, layer_ids=[1, 3, 5])
    D, Fi, H, Hk, d = cfg["D"], cfg["F"], cfg["H"], cfg["Hk"], cfg["d"]
    shapes = {"fc.weight": (D, cfg["nF"] * D), "hidden_norm.weight": (D,), "norm.weight": (D,)}
    for l in range(cfg["L"]):
        pre = "layers.%d." % l
        shapes.update({pre + "self_attn.q_proj.weight": (H * d, D),
                       pre + "self_attn.k_proj.weight": (Hk * d, D),
                       pre + "self_attn.v_proj.weight": (Hk * d, D),
                       pre + "self_attn.o_proj.weight": (D, H * d),
                       pre + "mlp.gate_proj.weight": (Fi, D), pre + "mlp.up_proj.weight": (Fi, D),
                       pre + "mlp.down_proj.weight": (D, Fi),
                       pre + "input_layernorm.weight": (D,),
                       pre + "post_attention_layernorm.weight": (D,),
                       pre + "self_attn.q_norm.weight": (d,), pre + "self_attn.k_norm.weight": (d,)})
    params = {}
    for n, s in shapes.items():
        params[n] = (1.0 + 0.1 * rn(*s)) if len(s) == 1 else 0.15 * rn(*s)
    embed, lm_head = 0.5 * rn(cfg["V"], D), 0.5 * rn(cfg["V"], D)
    lens = [21, 14]
    seq_off = [0, lens[0], lens[0] + lens[1]]
    T = seq_off[-1]
    X = rn(T, cfg["nF"] * D)
    ids = torch.randint(0, cfg["V"] - 1, (T,), generator=g)
    lmask = torch.ones(T, dtype=torch.long)
    lmask[0:3] = 0          # prompt of sequence 0
    lmask[12] = 0           # a hole in its response
    lmask[seq_off[1]:seq_off[1] + 2] = 0  # prompt of sequence 1
    # anchors (3.2 steps 1-2): candidates with loss_mask[p] and loss_mask[p+1], 4 per sequence
    n_anchors, anchors = 4, []
    for s in range(2):
        a, b = seq_off[s], seq_off[s + 1]
        m = lmask[a:b]
        cand = torch.tensor([p for p in range(b - a - 1) if m[p] and m[p + 1]])
        pick = cand[torch.randperm(len(cand), generator=g)[:n_anchors]]
        anchors.append(pick.sort().values)
    gamma = 4.0  # block size 8

    model = DFlashRef(cfg, params, embed, lm_head)
    for v in params.values():
        v.requires_grad_(True)
    loss = model.loss(X, ids, lmask, seq_off, anchors, gamma)
    loss.backward()

    dump = RefDump()
    dump.add("cfg", torch.tensor([D, H, Hk, d, Fi, cfg["L"], cfg["B"], cfg["nF"], cfg["V"],
                                  cfg["mask"], cfg["num_target_layers"]] + cfg["layer_ids"]))
    dump.add("eps", torch.tensor([cfg["eps"]]))
    dump.add("theta", torch.tensor([cfg["theta"]]))
    dump.add("gamma", torch.tensor([gamma]))
    dump.add("X", X)
    dump.add("ids", ids)
    dump.add("loss_mask", lmask)
    dump.add("seq_off", torch.tensor(seq_off))
    dump.add("blk_seq", torch.cat([torch.full((len(a),), s) for s, a in enumerate(anchors)]))
    dump.add("blk_anchor", torch.cat(anchors))
    dump.add("embed", embed)
    dump.add("lm_head", lm_head)
    for n in model.names():
        dump.add("p." + n, params[n].detach())
    dump.add("loss", loss.detach().reshape(1))
    for n in model.names():
        dump.add("g." + n, params[n].grad)

    # 10 AdamW steps on the same batch. wd 0.1 makes the decay matter; eps 1e-5 (not 1e-8) keeps
    # an element whose gradient is about 0 from turning float32 noise into a step of about lr
    # (Adam divides by sqrt(v)), which made single parameters differ by 1e-4 with eps 1e-8
    hp = dict(lr=1e-2, warmup_ratio=0.2, total=10, min_ratio=0.1, clip=1.0, wd=0.1,
              b1=0.9, b2=0.999, eps=1e-5)
    names = model.names()
    mats = [params[n] for n in names if params[n].dim() == 2]
    vecs = [params[n] for n in names if params[n].dim() == 1]
    opt = torch.optim.AdamW([{"params": mats, "weight_decay": hp["wd"]},
                             {"params": vecs, "weight_decay": 0.0}],
                            lr=hp["lr"], betas=(hp["b1"], hp["b2"]), eps=hp["eps"])
    losses, norms, lrs = [], [], []
    for step in range(hp["total"]):
        opt.zero_grad()
        l = model.loss(X, ids, lmask, seq_off, anchors, gamma)
        l.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(mats + vecs, hp["clip"])))
        lr = lr_at(step, hp["lr"], hp["warmup_ratio"], hp["total"], hp["min_ratio"])
        for grp in opt.param_groups:
            grp["lr"] = lr
        opt.step()
        losses.append(float(l))
        lrs.append(lr)
    dump.add("train.hp", torch.tensor([hp["lr"], hp["warmup_ratio"], hp["total"], hp["min_ratio"],
                                       hp["clip"], hp["wd"], hp["b1"], hp["b2"], hp["eps"]]))
    dump.add("traj.loss", torch.tensor(losses))
    dump.add("traj.grad_norm", torch.tensor(norms))
    dump.add("traj.lr", torch.tensor(lrs))
    for n in names:  # the parameters after the steps: which tensors took the decay
        dump.add("q." + n, params[n].detach())
    dump.write(out)
    print("dflash_ref: loss %.6f, 10-step trajectory %.4f -> %.4f" % (float(loss), losses[0],
                                                                       losses[-1]))


if __name__ == "__main__":
    main(sys.argv[1])
