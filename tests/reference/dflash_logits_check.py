"""dflash_logits_check: loads OUR drafter checkpoint (config.json + model.safetensors) into the
PyTorch reference model of dflash_ref.py and compares its logits with our drafter's.

    dflash_logits_check.py --prog BUILD/tests/reference/dflash_logits \\
        [--ckpt CKPT_DIR --target TARGET_DIR] [--seqs 2] [--len 96] [--anchors 6] [--tol 1e-4]

--ckpt: a checkpoint directory written by dflash_ckpt (e.g. runs/x/ckpt/step-000001000);
--target: the target model directory whose embed_tokens / lm_head the drafter shares.
Without them, `dflash_logits --make-tiny` writes a random tiny checkpoint (the CI mode).
The script draws random target features, token ids and anchors, runs our drafter through the
dflash_logits program and the reference in float64 on the same (bf16-stored) weights, and
compares: max|ours - ref| / max|ref| over all logits <= tol, and the argmax of every row where the
reference's top-2 margin is clear.
Then the checkpoint's own dflash.py (the module config.json's auto_map names): loaded with
transformers' AutoModel.from_pretrained(trust_remote_code=True) where transformers is installed,
else imported from the file with the weights of model.safetensors; each block is run alone, the
way a server drafts (its context = the sequence's features before the anchor), and its logits
must match the reference's rows of that block: in float64 to 1e-9, and in bfloat16 (on the GPU
when there is one) to 5e-2. Its RMSNorms alone in bfloat16 on the CPU must round as transformers'
Qwen3RMSNorm does, bit for bit (normalised in fp32, cast to bf16, then times the weight):
the 5e-2 above cannot tell that order from multiplying first.
Last, dflash.py's spec_generate (greedy speculative decoding, the target verifying each block)
with a float64 stand-in target of transformers' calling convention (target_ref.py's Qwen3
forward, the KV cache being the token prefix): its output must be exactly the target's greedy
decoding, and what each cycle accepted what the offline trajectory over that output finds (the
drafter given the right context). The stand-in's lm_head ranks only two tokens, so drafts and
target agree often and cycles accept several tokens.
Exit 0 pass, 1 mismatch, 77 when torch is missing.
"""
import argparse
import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
except ImportError:
    print("SKIPPED: torch not installed")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dflash_ref import DFlashRef, rmsnorm  # noqa: E402
from refdump import RefDump  # noqa: E402
import target_ref  # noqa: E402


def read_safetensors(path):
    """name -> float64 torch tensor, for BF16 / F16 / F32 files (no safetensors package needed)."""
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, t in hdr.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        buf = raw[base + b:base + e]
        if t["dtype"] == "BF16":
            a = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif t["dtype"] == "F16":
            a = np.frombuffer(buf, dtype="<f2").astype(np.float32)
        elif t["dtype"] == "F32":
            a = np.frombuffer(buf, dtype="<f4")
        else:
            continue
        out[name] = torch.from_numpy(a.astype(np.float64).reshape(t["shape"]))
    return out


def read_target_tensors(target, names):
    """The named tensors of a HF model directory (single file or sharded index)."""
    idx = os.path.join(target, "model.safetensors.index.json")
    files = {}
    if os.path.exists(idx):
        wm = json.load(open(idx))["weight_map"]
        for n in names:
            if n in wm:
                files.setdefault(wm[n], []).append(n)
    else:
        files["model.safetensors"] = names
    out = {}
    for fn, ns in files.items():
        t = read_safetensors(os.path.join(target, fn))
        for n in ns:
            if n in t:
                out[n] = t[n]
    return out


def read_refdump(path):
    with open(path, "rb") as f:
        raw = f.read()
    assert raw[:8] == b"DFREFDMP", path
    ver, count = struct.unpack("<II", raw[8:16])
    off, out = 16, {}
    for _ in range(count):
        (ln,) = struct.unpack("<I", raw[off:off + 4])
        name = raw[off + 4:off + 4 + ln].decode()
        off += 4 + ln
        dt, nd = struct.unpack("<II", raw[off:off + 8])
        off += 8
        dims = struct.unpack("<%dq" % nd, raw[off:off + 8 * nd])
        off += 8 * nd
        cnt = int(np.prod(dims)) if nd else 1
        a = np.frombuffer(raw[off:off + 4 * cnt], dtype="<f4" if dt == 0 else "<i4")
        off += 4 * cnt
        out[name] = a.reshape(dims)
    return out


def load_shipped_module(ckpt, params, tmp, dtype):
    """The checkpoint's dflash.py as a model in dtype: through AutoModel when transformers is
    installed (what a user runs), else the file imported directly. Returns (model, how)."""
    # transformers copies remote code into its module cache: keep that out of the user's home
    os.environ.setdefault("HF_MODULES_CACHE", os.path.join(tmp, "hf_modules"))
    try:
        import transformers  # noqa: F401
    except ImportError:
        transformers = None
    if transformers is not None:
        from transformers import AutoModel
        model = AutoModel.from_pretrained(ckpt, trust_remote_code=True, dtype=dtype)
        return model.eval(), "AutoModel (transformers %s)" % transformers.__version__
    spec = importlib.util.spec_from_file_location("dflash_shipped", os.path.join(ckpt,
                                                                                 "dflash.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cj = json.load(open(os.path.join(ckpt, "config.json")))
    model = mod.DFlashDraftModel(type("Config", (), cj)())
    missing, unexpected = model.load_state_dict(params, strict=False)
    if missing or unexpected:
        raise SystemExit("FAIL: dflash.py's tensors differ from model.safetensors: missing %s, "
                         "unexpected %s" % (missing[:5], unexpected[:5]))
    return model.to(dtype).eval(), "dflash.py imported (no transformers)"


def check_shipped_module(ckpt, params, embed, lm_head, X, ids, seq_off, anchors, ref, tmp):
    """ref: the reference's logits, rows block by block in anchor order. The module runs twice:
    in float64 on the CPU (must match to 1e-9) and in bfloat16 on the GPU when there is one (to
    5e-2, bf16's rounding through the layers). True when both match."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    ok = True
    for dtype, where, tol in ((torch.float64, "cpu", 1e-9), (torch.bfloat16, dev, 5e-2)):
        model, how = load_shipped_module(ckpt, params, tmp, dtype)
        model = model.to(where)
        B = model.block_size
        rows, err = 0, 0.0
        scale = max(float(np.abs(ref).max()), 1e-30)
        with torch.no_grad():
            for s, anc in enumerate(anchors):
                a0 = seq_off[s]
                for a in anc.tolist():
                    noise = embed[model.block_ids(ids[a0 + a:a0 + a + 1])].reshape(1, B, -1)
                    out = model(noise.to(where, dtype), X[a0:a0 + a][None].to(where, dtype))
                    got = (out[0].double().cpu() @ lm_head.T).numpy()
                    err = max(err, float(np.abs(got - ref[rows:rows + B]).max()) / scale)
                    rows += B
        print("dflash_logits_check: the checkpoint's dflash.py through %s, %s on %s, %d blocks "
              "drafted one by one: max rel err %.2e against the reference (tol %.0e): %s"
              % (how, str(dtype).replace("torch.", ""), where, rows // B, err, tol,
                 "PASS" if err <= tol else "FAIL"))
        ok = ok and err <= tol
    return ok


def check_norm_rounding(ckpt, params, tmp):
    """The checkpoint's dflash.py RMSNorms in bfloat16 on the CPU, bit for bit against the
    rounding points of reference/dflash.md 1.4 (transformers' Qwen3RMSNorm): normalised in fp32,
    cast back to bf16, then multiplied by the weight in bf16. The normalised values come from
    dflash_ref.rmsnorm in float64 (the oracle's, weight 1); the bf16 product of two bf16 values is
    their exact product rounded once. The bf16 check of check_shipped_module cannot see the
    order (one ulp at each norm, under bf16's noise through the layers: the order that rounds once
    read 1.6e-2 there, this one 1.8e-2), so this one compares the norms alone. Elements whose
    normalised value lies within 2^-20 of a bf16 rounding boundary (fp32 and float64 may round
    it apart) are left out; the rest must be equal, and the inputs must tell the orders apart:
    on >= 1% of them the multiply-then-round-once order gives another bf16 value."""
    model, how = load_shipped_module(ckpt, params, tmp, torch.bfloat16)
    bf = torch.bfloat16
    g = torch.Generator().manual_seed(5)
    n_norms = n_el = n_left_out = bad = apart = 0
    with torch.no_grad():
        for name, m in model.named_modules():
            if not type(m).__name__.endswith("RMSNorm"):
                continue
            n = m.weight.shape[0]
            x = (3.0 * torch.randn(512, n, generator=g, dtype=torch.float64)).to(bf)
            got = m(x)
            w = m.weight.detach().double()
            y = rmsnorm(x.double(), torch.ones(n, dtype=torch.float64), m.eps)
            want = (w * y.to(bf).double()).to(bf)
            sure = ((y * (1 + 2.0 ** -20)).to(bf) == y.to(bf)) & \
                ((y * (1 - 2.0 ** -20)).to(bf) == y.to(bf))
            once = (w * y).to(bf)
            n_norms += 1
            n_el += int(sure.sum())
            n_left_out += int((~sure).sum())
            bad += int(((got != want) & sure).sum())
            apart += int(((once != want) & sure).sum())
    ok = n_norms > 0 and bad == 0 and apart >= 0.01 * n_el
    print("dflash_logits_check: the checkpoint's dflash.py RMSNorm (%s), %d norms in bfloat16: "
          "%d of %d elements differ from normalise, round to bf16, multiply by the weight (%d "
          "left out at a rounding boundary; multiplying first would differ on %d): %s"
          % (how, n_norms, bad, n_el, n_left_out, apart, "PASS" if ok else "FAIL"))
    return ok


class PrefixCache:
    """The stand-in's KV cache: the tokens seen so far. crop(-n) drops the last n (a positive
    length is refused: transformers deprecated it in 5.17 and drops it in 5.18)."""

    def __init__(self):
        self.ids = []

    def crop(self, n):
        assert n < 0, "crop(%d): transformers 5.18 takes only negative counts" % n
        self.ids = self.ids[:len(self.ids) + n]


class StandInTarget:
    """A causal LM with transformers' calling convention (logits, past_key_values,
    hidden_states with the embeddings first and the final-normed state last) over
    target_ref.forward_one in float64; each call recomputes the whole prefix."""

    def __init__(self, cfg, weights):
        self.cfg, self.W = cfg, weights
        self.embed = torch.nn.Embedding.from_pretrained(weights["model.embed_tokens.weight"])
        self.head = torch.nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False).double()
        self.head.weight.data = weights["lm_head.weight"]

    def get_input_embeddings(self):
        return self.embed

    def get_output_embeddings(self):
        return self.head

    def __call__(self, ids, past_key_values=None, use_cache=False, output_hidden_states=False):
        cache = past_key_values or PrefixCache()
        full = cache.ids + ids[0].tolist()
        outs, logits = target_ref.forward_one(torch, self.cfg, self.W, torch.tensor(full),
                                              torch.arange(len(full)))
        n = ids.shape[1]
        eps = self.cfg["rms_norm_eps"]
        last = target_ref.rmsnorm(torch, outs[-1], self.W["model.norm.weight"], eps)
        hs = [self.W["model.embed_tokens.weight"][full]] + outs[:-1] + [last]
        cache.ids = full
        return argparse.Namespace(logits=logits[-n:][None], past_key_values=cache,
                                  hidden_states=tuple(h[-n:][None] for h in hs))


def trajectory(model, target, seq, P):
    """What each cycle of greedy speculative decoding of seq (prompt of P tokens) commits,
    found offline: the block anchored at p drafted from the features of positions < p (one
    forward over the whole sequence), a = its leading tokens equal to seq's next ones, the cycle
    commits a + 1 tokens (at most up to the end of seq), and the next anchor is p + a + 1."""
    S = len(seq)
    ids = torch.tensor([seq])
    feats = model.target_features(target(ids).hidden_states)
    head = target.get_output_embeddings()
    out, p = [], P
    while p < S - 1:
        block = target.get_input_embeddings()(model.block_ids(ids[0, p:p + 1]))
        draft = head(model(block, feats[:, :p])).argmax(-1)[0, 1:].tolist()
        a = 0
        while a < len(draft) and p + a + 1 < S and draft[a] == seq[p + a + 1]:
            a += 1
        out.append(min(a + 1, S - 1 - p))
        p += a + 1
    return out


def check_spec_generate(ckpt, params, tmp):
    """spec_generate against the stand-in target's greedy decoding, over a few prompts."""
    model, how = load_shipped_module(ckpt, params, tmp, torch.float64)
    cj = json.load(open(os.path.join(ckpt, "config.json")))
    tcfg = dict(target_ref.FAMILIES["qwen3"][0], hidden_size=cj["hidden_size"],
                vocab_size=cj["vocab_size"], num_hidden_layers=cj["num_target_layers"],
                tie_word_embeddings=False)
    W = {n: t.double() for n, t in target_ref.random_weights(torch, tcfg, 7)}
    g = torch.Generator().manual_seed(11)
    head = torch.zeros(tcfg["vocab_size"], tcfg["hidden_size"], dtype=torch.float64)
    v = torch.randn(tcfg["hidden_size"], generator=g, dtype=torch.float64)
    head[3], head[5] = v, -v  # every argmax is token 3 or 5
    W["lm_head.weight"] = head
    target = StandInTarget(tcfg, W)
    same, cycles, longest, n_prompts, new = 0, [], 0, 4, 24
    for k in range(n_prompts):
        prompt = torch.randint(0, tcfg["vocab_size"], (1, 5 + 3 * k), generator=g)
        out = target(prompt, use_cache=True)
        ref = prompt[0].tolist()
        while len(ref) < prompt.shape[1] + new:  # greedy, one token per call
            ref.append(int(out.logits[0, -1].argmax()))
            out = target(torch.tensor([ref[-1:]]), past_key_values=out.past_key_values)
        got = model.spec_generate(input_ids=prompt, target=target, max_new_tokens=new)
        same += int(got[0].tolist() == ref and
                    model.acceptance == trajectory(model, target, ref, prompt.shape[1]))
        cycles += model.acceptance
        longest = max(longest, max(model.acceptance))
    ok = same == n_prompts and longest > 1 and sum(cycles) == n_prompts * (new - 1)
    print("dflash_logits_check: the checkpoint's dflash.py spec_generate (%s) with a float64 "
          "stand-in target: %d of %d outputs equal its greedy decoding (with the trajectory's "
          "accepted lengths), %d cycles, mean accepted "
          "%.2f, longest %d: %s" % (how, same, n_prompts, len(cycles),
                                    sum(cycles) / len(cycles), longest, "PASS" if ok else "FAIL"))
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prog", required=True)
    ap.add_argument("--ckpt")
    ap.add_argument("--target")
    ap.add_argument("--seqs", type=int, default=2)
    ap.add_argument("--len", type=int, default=48)
    ap.add_argument("--anchors", type=int, default=4)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="dflash_logits_")
    if a.ckpt:
        if not a.target:
            ap.error("--ckpt needs --target (the embed_tokens / lm_head source)")
        ckpt, embed_src = a.ckpt, a.target
    else:
        embed_src = os.path.join(tmp, "embed.bin")
        ckpt = subprocess.check_output([a.prog, "--make-tiny", os.path.join(tmp, "ckpt"),
                                        embed_src]).decode().strip().splitlines()[-1]
    cj = json.load(open(os.path.join(ckpt, "config.json")))
    dc = cj["dflash_config"]
    cfg = dict(D=cj["hidden_size"], H=cj["num_attention_heads"], Hk=cj["num_key_value_heads"],
               d=cj.get("head_dim", cj["hidden_size"] // cj["num_attention_heads"]),
               F=cj["intermediate_size"], L=cj["num_hidden_layers"],
               B=cj.get("block_size", dc.get("block_size", 16)), nF=len(dc["target_layer_ids"]),
               V=cj["vocab_size"], mask=dc["mask_token_id"], eps=cj["rms_norm_eps"],
               theta=cj["rope_theta"])
    params = read_safetensors(os.path.join(ckpt, "model.safetensors"))
    if embed_src.endswith(".bin"):
        e = read_refdump(embed_src)
        embed = torch.from_numpy(e["embed"].astype(np.float64))
        lm_head = torch.from_numpy(e["lm_head"].astype(np.float64))
    else:
        t = read_target_tensors(embed_src, ["model.embed_tokens.weight", "lm_head.weight"])
        embed = t["model.embed_tokens.weight"]
        lm_head = t.get("lm_head.weight", embed)
    model = DFlashRef(cfg, params, embed, lm_head)
    missing = [n for n in model.names() if n not in params]
    if missing:
        print("FAIL: checkpoint lacks", missing[:5])
        return 1

    g = torch.Generator().manual_seed(a.seed)
    lens = [a.len - 7 * s for s in range(a.seqs)]
    seq_off = [0]
    for n in lens:
        seq_off.append(seq_off[-1] + n)
    T = seq_off[-1]
    X = torch.randn(T, cfg["nF"] * cfg["D"], generator=g)
    ids = torch.randint(0, cfg["V"], (T,), generator=g)
    anchors = [torch.randperm(n - 1, generator=g)[:a.anchors].sort().values for n in lens]
    dump = RefDump()
    dump.add("X", X)
    dump.add("ids", ids)
    dump.add("seq_off", torch.tensor(seq_off))
    dump.add("blk_seq", torch.cat([torch.full((len(x),), s) for s, x in enumerate(anchors)]))
    dump.add("blk_anchor", torch.cat(anchors))
    inp, outp = os.path.join(tmp, "in.bin"), os.path.join(tmp, "out.bin")
    dump.write(inp)
    subprocess.check_call([a.prog, ckpt, embed_src, inp, outp])
    ours = read_refdump(outp)

    X32 = torch.from_numpy(X.numpy().astype(np.float32).astype(np.float64))  # what C saw
    ref = []
    with torch.no_grad():
        for s, anc in enumerate(anchors):
            out = model.block_outputs(X32[seq_off[s]:seq_off[s + 1]], ids[seq_off[s]:seq_off[s + 1]],
                                      anc)
            ref.append(out @ lm_head.T)
    ref = torch.cat(ref).numpy()
    lo = ours["logits"].astype(np.float64)
    err = np.abs(lo - ref).max() / max(np.abs(ref).max(), 1e-30)
    top2 = np.sort(ref, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 1e-3 * np.abs(ref).max()
    am_bad = int(((ours["argmax"] != ref.argmax(1)) & clear).sum())
    ok = err <= a.tol and am_bad == 0
    print("dflash_logits_check: %s, %d rows x %d vocab, max rel err %.2e (tol %.0e), "
          "argmax differs on %d of %d clear rows: %s"
          % (ckpt, lo.shape[0], lo.shape[1], err, a.tol, am_bad, int(clear.sum()),
             "PASS" if ok else "FAIL"))
    ok = check_shipped_module(ckpt, params, embed, lm_head, X32, ids, seq_off, anchors, ref,
                              tmp) and ok
    ok = check_norm_rounding(ckpt, params, tmp) and ok
    ok = check_spec_generate(ckpt, params, tmp) and ok
    shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
