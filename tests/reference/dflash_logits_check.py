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
when there is one) to 5e-2.
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
from dflash_ref import DFlashRef  # noqa: E402
from refdump import RefDump  # noqa: E402


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
    shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
