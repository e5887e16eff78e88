#!/usr/bin/env python3
"""hf_drafter_tau: a trained checkpoint drafts through transformers as it does in our eval.

The user's path: the target loaded with AutoModelForCausalLM, our drafter checkpoint with
AutoModel.from_pretrained(trust_remote_code=True) (the checkpoint's dflash.py), one block drafted
at a time as dflash.py's docstring shows. Over the held-out sequences (the target's own greedy
continuations) it replays greedy speculative decoding of each reply (a maximal span of
loss_mask 1): from its start p, draft a block anchored at p with the context features of
positions < p, accept the leading drafted tokens equal to the reply's next tokens (a; none past
the reply's end), go on at p + a + 1; tau = the mean over replies of each reply's mean(a + 1)
(tau_pooled: over all cycles). The same trajectory method as
`dflash-drafter eval` (common/nn/dflash_eval.h), which this script runs on the same data and
checkpoint; the two tau (and the two pooled) must agree within --tol (bf16 storage on our side, float32
here: a handful of near-tied argmax may differ).
Then dflash.py's spec_generate (the target verifying each drafted block over its KV cache) on
every held-out prompt must return exactly the target's own greedy decoding, and its
mean accepted length must agree with the pooled tau above within --tol (the prompt: everything before
the first reply, which runs to the end in the demo's dflash-gen data).

  hf_drafter_tau.py --build BUILD [--demo DIR] [--tol 0.05]
BUILD: a build tree (its services/drafter/dflash-drafter runs the eval). DIR: a work directory
of scripts/demo (target/, eval.jsonl, eval.shard, checkpoints/step-*); without it the script
first runs `scripts/demo --quick` with BUILD's binaries (the cuda backend when there is a GPU)
into a temporary one, which trains the drafter it checks.
Exit 0 when they agree, 1 when not, 77 (SKIPPED) without torch or transformers.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

try:
    import torch
    from transformers import AutoModel, AutoModelForCausalLM
except ImportError:
    print("SKIPPED: torch or transformers not installed")
    sys.exit(77)


def replies(mask):
    """The replies of a sequence: its maximal spans [b, e) of loss_mask 1 (one per assistant
    reply with its end-of-turn token; one to the end in dflash-gen's data)."""
    spans, b = [], None
    for i, m in enumerate(mask + [0]):
        if m and b is None:
            b = i
        elif not m and b is not None:
            spans.append((b, i))
            b = None
    return spans


def walk(drafter, target, ids, mask, dev):
    """[(cycles, accepted)] of one sequence's greedy trajectories, one per reply [b, e): from
    p = b, draft a block with the context features of positions < p (earlier turns included),
    accept the leading drafted tokens equal to the reply's next tokens (none past e: decoding
    ends at the reply's last token), go on at p + a + 1 while p < e - 1. The rule of
    common/nn/dflash_eval.h."""
    B = drafter.block_size
    seq = torch.tensor(ids, device=dev)[None]
    with torch.no_grad():
        hs = target(seq, output_hidden_states=True).hidden_states
        feats = drafter.target_features(hs)
        embed = target.get_input_embeddings()
        out = []
        for b, e in replies(mask):
            p, cycles, accepted = b, 0, 0
            while p < e - 1:
                block = embed(drafter.block_ids(seq[:, p]))
                draft = target.lm_head(drafter(block, feats[:, :p])).argmax(-1)[0, 1:].tolist()
                a = 0
                while a < B - 1 and p + a + 1 < e and draft[a] == ids[p + a + 1]:
                    a += 1
                cycles += 1
                accepted += a + 1
                p += a + 1
            if cycles:
                out.append((cycles, accepted))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True, help="a build tree")
    ap.add_argument("--demo", help="a scripts/demo work directory (default: run the demo)")
    ap.add_argument("--tol", type=float, default=0.05)
    a = ap.parse_args()
    drafter_bin = os.path.join(a.build, "services", "drafter", "dflash-drafter")
    if not a.demo:
        a.demo = tempfile.mkdtemp(prefix="hf_drafter_tau_")
        demo = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                            "demo")
        env = dict(os.environ, DEMO_BACKEND="cuda" if torch.cuda.is_available() else "host")
        run = subprocess.run([demo, "--build", a.build, "--no-build", "--quick", "--out", a.demo],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if run.returncode != 0:
            print(run.stdout.decode()[-3000:])
            print("hf_drafter_tau: FAIL: scripts/demo --quick exited %d" % run.returncode)
            return 1
    ckpt = sorted(glob.glob(os.path.join(a.demo, "checkpoints", "step-*")))[-1]
    target_dir = os.path.join(a.demo, "target")
    ours = json.loads(subprocess.check_output(
        [drafter_bin, "eval", "--checkpoint", ckpt, "--model", target_dir,
         "--data", os.path.join(a.demo, "eval.shard"), "--json"]).decode().strip().splitlines()[-1])

    os.environ.setdefault("HF_MODULES_CACHE", tempfile.mkdtemp(prefix="hf_modules_"))
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).to(dev).eval()
    drafter = AutoModel.from_pretrained(ckpt, trust_remote_code=True,
                                        dtype=torch.float32).to(dev).eval()
    per_reply, seqs = [], 0
    with open(os.path.join(a.demo, "eval.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            r = walk(drafter, target, row["input_ids"], row["loss_mask"], dev)
            per_reply += r
            seqs += len(r) > 0
    cycles = sum(c for c, _ in per_reply)
    tau = sum(acc / c for c, acc in per_reply) / max(len(per_reply), 1)
    pooled = sum(acc for _, acc in per_reply) / max(cycles, 1)
    ok = (abs(tau - ours["tau"]) <= a.tol and abs(pooled - ours["tau_pooled"]) <= a.tol and
          cycles > 0)
    print("hf_drafter_tau: %s through transformers (AutoModel + the target's AutoModelForCausalLM"
          ", float32 on %s): tau %.4f (pooled %.4f) over %d replies, %d cycles of %d sequences; "
          "dflash-drafter eval: tau %.4f (pooled %.4f) over %d replies, %d cycles; |difference| "
          "%.4f (tol %.2f): %s"
          % (ckpt, dev, tau, pooled, len(per_reply), cycles, seqs, ours["tau"],
             ours["tau_pooled"], ours["responses"], ours["cycles"], abs(tau - ours["tau"]),
             a.tol, "PASS" if ok else "FAIL"))
    return 0 if check_spec_generate(drafter, target, a.demo, dev, ours["tau_pooled"], a.tol) \
        and ok else 1


def greedy(target, prompt, n):
    """The target's greedy continuation by n tokens, one token per forward over its KV cache
    (generate() without its logits processors: no end-of-sequence rule)."""
    with torch.no_grad():
        out = target(prompt, use_cache=True)
        ids = [int(out.logits[0, -1].argmax())]
        while len(ids) < n:
            out = target(torch.tensor([[ids[-1]]], device=prompt.device),
                         past_key_values=out.past_key_values, use_cache=True)
            ids.append(int(out.logits[0, -1].argmax()))
    return torch.cat([prompt, torch.tensor([ids], device=prompt.device)], dim=1)


def check_spec_generate(drafter, target, demo, dev, tau, tol):
    """spec_generate on every held-out prompt against the target's greedy decoding (as many new
    tokens as the sequence's response). True when every output is the same and the mean
    accepted length is within tol of tau."""
    same = prompts = 0
    lengths = []
    with open(os.path.join(demo, "eval.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            if 1 not in row["loss_mask"]:
                continue
            P = row["loss_mask"].index(1)
            n = len(row["input_ids"]) - P
            prompt = torch.tensor(row["input_ids"][:P], device=dev)[None]
            ref = greedy(target, prompt, n)
            got = drafter.spec_generate(input_ids=prompt, target=target, max_new_tokens=n)
            prompts += 1
            same += int(got.shape == ref.shape and bool((got == ref).all()))
            lengths += drafter.acceptance
    mean = sum(lengths) / max(len(lengths), 1)
    ok = same == prompts and prompts > 0 and abs(mean - tau) <= tol
    print("hf_drafter_tau: dflash.py's spec_generate: %d of %d outputs equal the target's "
          "greedy decoding; mean accepted length %.4f over %d cycles (eval tau %.4f, tol %.2f): %s"
          % (same, prompts, mean, len(lengths), tau, tol, "PASS" if ok else "FAIL"))
    return ok


if __name__ == "__main__":
    sys.exit(main())
