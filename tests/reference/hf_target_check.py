#!/usr/bin/env python3
"""hf_target_check: our target forward against Hugging Face transformers (run on the GPU machine).

For each family (Qwen3, Qwen2, Llama, plus a deeper Qwen3 using DFlash's default layer rule) it
builds the model class from a config (Qwen3ForCausalLM / Qwen2ForCausalLM / LlamaForCausalLM),
re-initialises every parameter with a seeded random draw strong enough to make attention and
norms matter (norm weights jittered around 1, biases non-zero), saves it with save_pretrained in
float32, runs transformers with output_hidden_states=True on several sequences of different
lengths (one forward per sequence), then runs OUR forward on the same checkpoint with the same
sequences PACKED into one batch (`target_reference --capture`, built from test_target_ref.c),
and compares every captured layer
token by token plus the last-token logits of every sequence:
    max over (token, layer) of  max|ours - hf| / max|hf|  <= 1e-4      (fp32)
Captured id k is output_hidden_states[k + 1] (checked against a forward hook on decoder layer k);
for the last decoder layer transformers returns the final-normed state there, so that one layer
is taken from the hook instead.

  python3 tests/reference/hf_target_check.py --build build      (one command; exit 0 = pass)
Prints SKIPPED and exits 77 (not a pass) when transformers, torch or numpy is absent, like
dflash_logits_check.py. Runs on the CPU by default
(exact fp32, no TF32); --device cuda is allowed.
"""
import argparse
import glob
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

TOL = 1e-4


def cases():
    from target_ref import FAMILIES
    out = []
    for fam, (cfg, ids, lengths) in FAMILIES.items():
        out.append((fam, dict(cfg), list(ids), list(lengths)))
    deep = dict(FAMILIES["qwen3"][0])
    deep.update(hidden_size=128, intermediate_size=256, num_hidden_layers=10, num_attention_heads=8,
                num_key_value_heads=2, head_dim=32, vocab_size=257, tie_word_embeddings=False)
    # DFlash's default rule for 3 features on 10 layers: round(1 + i*6/2) = [1, 4, 7]; plus the last
    # layer (9) to check the hook path.
    out.append(("qwen3-deep", deep, [1, 4, 7, 9], [64, 3, 33, 1, 20, 700]))
    return out


def has_llama3(d):
    for key in ("rope_scaling", "rope_parameters"):
        v = d.get(key)
        if isinstance(v, dict) and v.get("rope_type", v.get("type")) == "llama3":
            return True
    return False


def build_model(transformers, torch, fam_cfg, seed):
    mt = fam_cfg["model_type"]
    names = {"qwen3": ("Qwen3Config", "Qwen3ForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
             "llama": ("LlamaConfig", "LlamaForCausalLM")}[mt]
    Cfg, Model = getattr(transformers, names[0]), getattr(transformers, names[1])
    kw = {k: v for k, v in fam_cfg.items() if k not in ("architectures", "model_type", "torch_dtype")}
    cfg = Cfg(**kw)
    if "rope_scaling" in kw and not has_llama3(cfg.to_dict() if hasattr(cfg, "to_dict") else vars(cfg)):
        # transformers 5 spells it rope_parameters (with rope_theta inside)
        rp = dict(kw.pop("rope_scaling"), rope_theta=kw["rope_theta"])
        cfg = Cfg(**kw, rope_parameters=rp)
    try:
        cfg._attn_implementation = "eager"
    except Exception:
        pass
    torch.manual_seed(seed)
    model = Model(cfg).float().eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
    return model


def hf_forward(torch, model, ids, lengths, layer_ids, device):
    """Per sequence HF forward. Returns hidden [T, n*D] and logits [n_seqs, V] as float32 numpy.

    Captured id k is HF output_hidden_states[k + 1]. Each captured layer's output is also taken
    with a forward hook on model.model.layers[k]; for k < L-1 the two must agree (this checks the
    index convention of reference/dflash.md 1.3 against the installed transformers). For k = L-1
    HF's tuple holds the final-normed state, so the hook's value is used."""
    import numpy as np
    L = model.config.num_hidden_layers
    grabbed = {}

    def make_hook(k):
        def hook(_mod, _inp, out):
            grabbed[k] = out[0] if isinstance(out, tuple) else out
        return hook

    handles = [model.model.layers[k].register_forward_hook(make_hook(k)) for k in layer_ids]
    hid, logits, a, index_err = [], [], 0, 0.0
    try:
        for n in lengths:
            x = torch.tensor(ids[a:a + n], dtype=torch.long, device=device)[None]
            pos = torch.arange(n, device=device)[None]
            with torch.no_grad():
                out = model(input_ids=x, position_ids=pos, output_hidden_states=True)
            if len(out.hidden_states) != L + 1:
                raise RuntimeError("transformers returned %d hidden states for %d layers"
                                   % (len(out.hidden_states), L))
            cols = []
            for k in layer_ids:
                h = grabbed[k] if grabbed[k].dim() == 3 else grabbed[k][None]
                if k < L - 1:
                    index_err = max(index_err, (h - out.hidden_states[k + 1]).abs().max().item())
                    h = out.hidden_states[k + 1]
                cols.append(h[0].float().cpu())
            hid.append(torch.cat(cols, dim=-1))
            logits.append(out.logits[0, -1].float().cpu())
            a += n
    finally:
        for hd in handles:
            hd.remove()
    return (torch.cat(hid).numpy().astype(np.float32), torch.stack(logits).numpy().astype(np.float32),
            index_err)


def rel_rows(a, b):
    import numpy as np
    diff = np.abs(a.astype(np.float64) - b.astype(np.float64)).max(axis=-1)
    ref = np.abs(b.astype(np.float64)).max(axis=-1)
    r = diff / np.where(ref > 0, ref, 1.0)
    r[~np.isfinite(r)] = np.inf
    return r


def read_refdump(path):
    """The refdump.py format back into {name: numpy array}."""
    import numpy as np
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"DFREFDMP":
        raise ValueError("%s: not a refdump" % path)
    ver, count = struct.unpack_from("<II", data, 8)
    off, out = 16, {}
    for _ in range(count):
        (n,) = struct.unpack_from("<I", data, off)
        name = data[off + 4:off + 4 + n].decode()
        off += 4 + n
        dt, nd = struct.unpack_from("<II", data, off)
        dims = struct.unpack_from("<%dq" % nd, data, off + 8)
        off += 8 + 8 * nd
        numel = int(np.prod(dims)) if nd else 1
        a = np.frombuffer(data, dtype="<f4" if dt == 0 else "<i4", count=numel, offset=off)
        out[name] = a.reshape(dims)
        off += 4 * numel
    return out


def find_binary(build):
    hits = glob.glob(os.path.join(build, "**", "target_reference"), recursive=True)
    hits = [h for h in hits if os.access(h, os.X_OK) and os.path.isfile(h)]
    return hits[0] if hits else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build", help="CMake build directory holding test_target_ref")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--keep", help="write the checkpoints and case files here and keep them")
    ap.add_argument("--seed", type=int, default=4321)
    args = ap.parse_args()
    try:
        import numpy
        import torch
        import transformers
    except ImportError as e:
        print("SKIPPED: hf_target_check needs torch, numpy and transformers (%s)" % e)
        return 77
    from refdump import RefDump
    exe = find_binary(args.build)
    if not exe:
        print("error: no target_reference under %s; build first (cmake --build %s)" % (args.build, args.build))
        return 1
    print("transformers %s, torch %s, ours: %s" % (transformers.__version__, torch.__version__, exe))
    root = args.keep or tempfile.mkdtemp(prefix="hf_target_check.")
    fails = 0
    for ci, (fam, cfg, layer_ids, lengths) in enumerate(cases()):
        d = os.path.join(root, fam)
        os.makedirs(d, exist_ok=True)
        model = build_model(transformers, torch, cfg, args.seed + ci)
        model.save_pretrained(d)  # safetensors, float32
        with open(os.path.join(d, "config.json")) as f:
            saved = json.load(f)
        if "rope_scaling" in cfg and not has_llama3(saved):
            print("%s: FAIL: transformers did not keep the llama3 rope scaling in config.json" % fam)
            fails += 1
            continue
        model.to(args.device)
        g = torch.Generator().manual_seed(args.seed + 100 + ci)
        T = sum(lengths)
        ids = torch.randint(0, cfg["vocab_size"], (T,), generator=g).tolist()
        pos = [p for n in lengths for p in range(n)]
        seq_off = [0]
        for n in lengths:
            seq_off.append(seq_off[-1] + n)
        hid, logits, index_err = hf_forward(torch, model, ids, lengths, layer_ids, args.device)
        if index_err != 0.0:
            print("%s: FAIL: output_hidden_states[k+1] differs from decoder layer k's output by %.3g"
                  % (fam, index_err))
            fails += 1
        D = cfg["hidden_size"]
        case_in, case_out = os.path.join(d, "inputs.dump"), os.path.join(d, "ours.dump")
        dump = RefDump()
        dump.add("seq_off", numpy.array(seq_off, dtype=numpy.int32))
        dump.add("ids", numpy.array(ids, dtype=numpy.int32))
        dump.add("pos", numpy.array(pos, dtype=numpy.int32))
        dump.add("layer_ids", numpy.array(layer_ids, dtype=numpy.int32))
        dump.add("hf.hidden", hid)
        dump.add("hf.logits", logits)
        dump.write(case_in)
        r = subprocess.run([exe, "--capture", d, case_in, case_out])
        if r.returncode != 0:
            print("%s: FAIL: our forward exited with %d" % (fam, r.returncode))
            fails += 1
            continue
        ours = read_refdump(case_out)
        for j, k in enumerate(layer_ids):
            e = rel_rows(ours["hidden"][:, j * D:(j + 1) * D], hid[:, j * D:(j + 1) * D])
            ok = e.max() <= TOL
            fails += not ok
            print("%s: layer %d (HF hidden_states[%d]): max rel error %.3g over %d tokens (worst token %d) %s"
                  % (fam, k, k + 1, e.max(), T, int(e.argmax()), "ok" if ok else "FAIL"))
        e = rel_rows(ours["logits"], logits)
        ok = e.max() <= TOL
        fails += not ok
        print("%s: last-token logits of %d sequences: max rel error %.3g %s"
              % (fam, len(lengths), e.max(), "ok" if ok else "FAIL"))
    if not args.keep:
        import shutil
        shutil.rmtree(root, ignore_errors=True)
    print("FAILED" if fails else "PASSED: every captured layer and logit matches transformers within 1e-4")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
