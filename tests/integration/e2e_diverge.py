#!/usr/bin/env python3
"""e2e_diverge: a training run that diverges stops, and nothing non-finite is kept; a run whose
data has nothing to train on says so; weights that are not numbers are refused at the load.

A tiny random Qwen3 target and 32 generated sequences (batches of 4), then:
  1. refused at the load (before any broker): a copy of the target with one +inf weight in
     embed_tokens (what an overflowed float16 conversion leaves): dflash-target exits 1 and
     dflash-drafter 2, both naming the tensor;
  2. dflash-queue, dflash-target and dflash-drafter train 3 steps (--checkpoint-every 1) and
     exit 0: the broker commits step 3;
  3. the target is replaced by a copy whose layer 0 down_proj weights are huge but finite
     (1e38: accepted at the load) so that every captured hidden state overflows to NaN; the
     drafter, started again with the same flags, resumes from step 3 and its step 4 has a NaN
     loss. It must exit 7 naming step 4 and the loss, write no checkpoint after step 3 (and
     every checkpoint left is finite), and report no commit: the broker's committed step and
     batches stay at 3. Before this change it trained on, wrote NaN checkpoints, had them
     committed and exited 0;
  4. a checkpoint holding an infinity (a copy of step 3's with one weight patched) is refused by
     `dflash-drafter eval` (exit 1) and as --init-weights (exit 2), naming the tensor;
  5. with data in which every batch has nothing to train on, a fresh drafter (--accumulate 3)
     with --max-steps 10 exits 8 saying "no step trained" and naming the loss masks, without
     the fake "loss first 0.0000" summary or the advice to add epochs (it exited 0 with both);
     the batches it says it skipped are the batches it got (it counted steps of three).
     dflash-data and the model target refuse data with no anchor in a sequence the buckets keep
     (e2e_nodata.py), so these batches come from the synthetic target: one bucket of 1-token
     sequences (a loss token each, never two in a row), hidden states as wide as the model's.
Usage: e2e_diverge.py BUILD_DIR [--keep]. Exit 0 pass, 1 fail.
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_common import (Daemon, expect, exits, log, main_frame, report, run,  # noqa: E402
                        start_broker)


def read_safetensors(path):
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), bytearray(b[8 + n:])


def write_patched(src, dst, names, patch):
    """Copies safetensors file src to dst with the raw data of the tensors names passed through
    patch(dtype, data) -> data. The checksums go (another tool's file), so only the values
    change what the loaders see."""
    h, d = read_safetensors(src)
    for name in names:
        s, e = h[name]["data_offsets"]
        d[s:e] = patch(h[name]["dtype"], bytes(d[s:e]))
    h["__metadata__"] = {"format": "pt"}
    hb = json.dumps(h).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb + d)


def first_inf(dtype, data):
    inf = {"BF16": struct.pack("<H", 0x7F80), "F32": struct.pack("<I", 0x7F800000)}[dtype]
    return inf + data[len(inf):]


def all_huge(dtype, data):  # 1e38: finite, but a product of two of them overflows
    one = {"BF16": struct.pack("<H", 0x7E96), "F32": struct.pack("<f", 1e38)}[dtype]
    return one * (len(data) // len(one))


def copy_model(src, dst, fname, names, patch):
    os.makedirs(dst, exist_ok=True)
    for f in os.listdir(src):
        if f != fname:
            shutil.copy(os.path.join(src, f), os.path.join(dst, f))
    write_patched(os.path.join(src, fname), os.path.join(dst, fname), names, patch)


def non_finite(path):
    """Non-finite values among the F32 / BF16 tensors of a safetensors file."""
    h, d = read_safetensors(path)
    bad = 0
    for k, v in h.items():
        if k == "__metadata__":
            continue
        s, e = v["data_offsets"]
        if v["dtype"] == "BF16":
            xs = struct.unpack(f"<{(e - s) // 2}H", d[s:e])
            bad += sum((x & 0x7F80) == 0x7F80 for x in xs)
        elif v["dtype"] == "F32":
            xs = struct.unpack(f"<{(e - s) // 4}I", d[s:e])
            bad += sum((x & 0x7F800000) == 0x7F800000 for x in xs)
    return bad


def main():
    catch = (RuntimeError, OSError, KeyError, subprocess.TimeoutExpired)
    with main_frame("diverge", catch) as (build, env, failures):
        tools_log = env.path("tools.log")
        tgt = env.path("target")
        run([build.mkmodel, "--family", "qwen3", "--layers", "6", "--seed", "3", "--out", tgt],
            tools_log)
        run([build.gen, "--model", tgt, "--out", env.path("train.jsonl"), "--n", "32", "--seed",
             "5", "--greedy", "--prompt-max", "12", "--max-new", "20", "--threads", "1"],
            tools_log)
        run([build.data, "--in", env.path("train.jsonl"), "--out", env.path("train.shard"),
             "--model", tgt, "--buckets", "32"], tools_log)
        slots = ["--buckets", "32", "--token-budget", "128", "--max-seqs", "4", "--layers", "3",
                 "--runtime-dir", env.run, "--threads", "1", "--backend", "host",
                 "--timeout-ms", "1000", "--broker-wait-ms", "20000"]

        # 1. an infinite weight is refused at the load, by name
        copy_model(tgt, env.path("target-inf"), "model.safetensors", ["model.embed_tokens.weight"],
                   first_inf)
        rc, text = exits([build.target, "--name", "t-inf", "--model", env.path("target-inf"),
                          "--shards", env.path("train.shard"), *slots], env.path("t-inf.log"))
        expect(failures, "dflash-target on a target with an inf weight", rc, text, 1,
               [r"tensor model\.embed_tokens\.weight holds a non-finite value"])
        rc, text = exits([build.drafter, "--name", "d-inf", "--model", env.path("target-inf"),
                          *slots], env.path("d-inf.log"))
        expect(failures, "dflash-drafter on a target with an inf weight", rc, text, 2,
               [r"tensor model\.embed_tokens\.weight holds a non-finite value"])

        # 2. three good steps, committed
        queue = Daemon("queue", [build.queue, "--runtime-dir", env.run, "--journal", "none",
                                 "--min-ready", "1", "--max-depth", "4"], env.tmp)
        target_args = ["--name", "t1", "--shards", env.path("train.shard"), "--slots", "3",
                       "--epochs", "1", "--progress-ms", "0", *slots]
        target = Daemon("target", [build.target, "--model", tgt, *target_args], env.tmp)
        ckpt = env.path("ckpt")
        train = [build.drafter, "--name", "d1", "--model", tgt, "--block-size", "4",
                 "--anchors", "8", "--lr", "3e-3", "--total-steps", "8", "--checkpoint-every",
                 "1", "--keep-last", "5", "--checkpoint-dir", ckpt, "--progress-ms", "0", *slots]
        env.daemons = [queue, target]
        start_broker(build, env, queue)
        target.start()
        rc, text = exits([*train, "--max-steps", "3"], env.path("drafter1.log"))
        if rc != 0:
            raise RuntimeError(f"the first drafter run exited {rc}:\n{text[-1500:]}")
        st = env.status(build)
        log("e2e", f"after 3 good steps: committed step {st and st['committed_step']}, "
            f"batches committed {st and st['batches_committed']}")
        if not st or st["committed_step"] != 3 or st["batches_committed"] != 3:
            raise RuntimeError(f"the first run's 3 steps are not committed: {st}")

        # 3. the target now captures NaN hidden states: the resumed run diverges at step 4
        bad = env.path("target-nan")
        copy_model(tgt, bad, "model.safetensors", ["model.layers.0.mlp.up_proj.weight",
                                                    "model.layers.0.mlp.down_proj.weight"],
                   all_huge)
        target.stop()
        target = Daemon("target-nan", [build.target, "--model", bad, *target_args], env.tmp)
        env.daemons = [queue, target]
        target.start()
        rc, text = exits([*train, "--max-steps", "8"], env.path("drafter2.log"))
        expect(failures, "the drafter whose step 4 has a NaN loss", rc, text, 7,
               [r"resumed exactly from \S+step-0*3\b",
                r"training diverged at step 4: its loss (and gradient norm )?(is|are) not "
                r"finite", r"a lower --lr"])
        if re.search(r"reported the final checkpoint|checkpoint \S+ written",
                     text.split("resumed exactly")[-1]):
            failures.append("the diverged run reported a commit:\n" + text[-1500:])
        steps = sorted(d for d in os.listdir(ckpt) if d.startswith("step-"))
        if steps != [f"step-{s:09d}" for s in (1, 2, 3)]:
            failures.append(f"checkpoints after the divergence: {steps} (want steps 1-3 only)")
        for s in steps:
            for fname in ("model.safetensors", "training_state.safetensors"):
                n = non_finite(os.path.join(ckpt, s, fname))
                if n:
                    failures.append(f"{s}/{fname} holds {n} non-finite values")
        st = env.status(build)
        log("e2e", f"after the divergence: {st}")
        if not st or st["committed_step"] != 3 or st["batches_committed"] != 3:
            failures.append(f"the broker's commits moved past step 3: {st}")

        # 4. a checkpoint holding an infinity is refused by eval and as a warm start
        inf_ck = env.path("ckpt-inf")
        copy_model(os.path.join(ckpt, "step-000000003"), inf_ck, "model.safetensors",
                   ["fc.weight"], first_inf)
        rc, text = exits([build.drafter, "eval", "--checkpoint", inf_ck, "--model", tgt,
                          "--data", env.path("train.shard"), "--threads", "1"],
                         env.path("eval-inf.log"))
        expect(failures, "eval of a checkpoint with an inf weight", rc, text, 1,
               [r"tensor fc\.weight holds a non-finite value"])
        rc, text = exits([build.drafter, "--name", "d-warm", "--model", tgt, "--block-size", "4",
                          "--init-weights", inf_ck, *slots], env.path("warm-inf.log"))
        expect(failures, "a warm start from a checkpoint with an inf weight", rc, text, 2,
               [r"tensor fc\.weight holds a non-finite value"])
        target.stop()
        queue.stop()

        # 5. nothing to train on in any batch: the synthetic target's sequences of one token
        # (--buckets 1) have a loss token each, never two in a row
        with open(os.path.join(tgt, "config.json")) as f:
            mc = json.load(f)
        one = ["--buckets", "1", *slots[2:]]
        target = Daemon("target-masked", [build.target, "--model", "synthetic", "--name", "t1",
                                          "--slots", "3", "--epochs", "1", "--progress-ms", "0",
                                          "--batches-per-bucket", "8", "--hidden",
                                          str(mc["hidden_size"]), "--vocab-size",
                                          str(mc["vocab_size"]), *one], env.tmp)
        queue = Daemon("queue2", queue.argv, env.tmp)
        env.daemons = [queue, target]
        start_broker(build, env, queue)
        target.start()
        # (with --accumulate 3: steps of three slots, each skipped; the count is of batches)
        rc, text = exits([build.drafter, "--name", "d-masked", "--model", tgt, "--block-size",
                          "4", "--anchors", "8", "--max-steps", "10", "--accumulate", "3",
                          "--checkpoint-dir", env.path("ckpt-masked"), "--progress-ms", "0",
                          *one], env.path("drafter-masked.log"))
        expect(failures, "the drafter with nothing to train on", rc, text, 8,
               [r"training: no step trained in this run", r"no step trained: every one of "
                r"the \d+ batches this run got had no weighted position", r"loss masks"])
        said = re.search(r"every one of the (\d+) batches", text)
        got = re.search(r"(?:done|failed): (\d+) batches", text)
        if not said or not got or said.group(1) != got.group(1):
            failures.append(f"the drafter with nothing to train on counts "
                            f"{said and said.group(1)} batches skipped, but got "
                            f"{got and got.group(1)}")
        for wrong in (r"loss first", r"larger --epochs"):
            if re.search(wrong, text):
                failures.append(f"the drafter with nothing to train on says '{wrong}'")
    return report(env, failures)


if __name__ == "__main__":
    sys.exit(main())
