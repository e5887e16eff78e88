#!/usr/bin/env python3
"""e2e_accumulate: gradient accumulation (dflash-drafter --accumulate 3) through the daemons:
steps of three slots each, a SIGKILL inside an open step, and a last step with fewer batches.

A tiny random Qwen3 target, 40 generated sequences (about 10 batches of 4 in one epoch), then
dflash-queue, dflash-target --model and dflash-drafter --train --accumulate 3 --checkpoint-every
1. A batch of a step still open is acked with the step that will include it, which no
checkpoint holds yet. The drafter is SIGKILLed once a checkpoint is written and a batch of the
next (open) step was acked after it: the broker must hold that batch as trained, not committed,
and hand it out again when the restarted drafter resumes from the checkpoint. The restart trains
the rest; the epoch's last step gets the batches that are left (fewer than three when the count
is not a multiple of three) and is taken with them before the final checkpoint.

Pass conditions:
  * the restarted drafter resumes from a checkpoint of whole steps ("3 batches a step");
  * the ledger ends with every batch committed, none to do, in flight, trained-uncommitted or
    quarantined, and the broker's committed step equals the final checkpoint's;
  * the final checkpoint's step is ceil(batches / 3): every batch was in exactly one optimizer
    step of the final model, three to a step, the last one with the rest; its training state
    records accumulate 3, and each recipe flag given (--gamma, --clip, --warmup-ratio,
    --min-lr-ratio, --weight-decay, --anchor-seed, --lr, --total-steps, --anchors: each off its
    default), its config.json the --mask-token-id given, and the drafter says it started fresh
    from the --init-seed given;
  * metrics.jsonl's train/batches is 3 for every step but the last, which has the rest, and the
    drafter says it took that last step with the batches it had;
  * every daemon exits 0; the run's checkpoint resumed in a group (--group) is taken with its
    accumulate 3 (3 micro-steps a group step; it was refused, exit 2, before groups accumulated):
    it creates the group at the checkpoint's step, the broker has nothing left, it exits 0.
Usage: e2e_accumulate.py BUILD_DIR [--keep] [--backend host|cuda] (host by default; cuda: both
daemons on the GPU, slots through CUDA IPC: scripts/gpu-check's accum_cuda). Exit 0 pass, 1 fail.
"""
import json
import os
import re
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_common import (Daemon, drain_clean, kill_after_checkpoint, log,  # noqa: E402
                        main_frame, report, start_broker, stop_broker, tail, tiny_training,
                        wait_until)

N = 3  # --accumulate
# the recipe's other flags, each off its default: the training state must record each one (an
# option the drafter read but did not hand to the trainer would otherwise pass every test)
RECIPE = {"--gamma": "3.5", "--clip": "0.75", "--warmup-ratio": "0.125",
          "--min-lr-ratio": "0.25", "--weight-decay": "0.01", "--anchor-seed": "77",
          "--mask-token-id": "7", "--init-seed": "9"}
STATE_KEYS = {"--gamma": "gamma", "--clip": "clip", "--warmup-ratio": "warmup_ratio",
              "--min-lr-ratio": "min_lr_ratio", "--weight-decay": "weight_decay",
              "--anchor-seed": "seed", "--lr": "lr", "--total-steps": "total_steps",
              "--anchors": "n_anchors"}


def state_metadata(ckpt_dir):
    """The __metadata__ of a checkpoint's training_state.safetensors."""
    with open(os.path.join(ckpt_dir, "training_state.safetensors"), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)).get("__metadata__", {})


def main():
    backend = sys.argv[sys.argv.index("--backend") + 1] if "--backend" in sys.argv else "host"
    with main_frame("accumulate") as (build, env, failures):
        slots, queue, target = tiny_training(build, env, 40, "e2eaccum", backend)
        drafter = Daemon("drafter", [build.drafter, "--train", "--model", env.path("target"),
                                     "--block-size", "4", "--lr", "3e-3", "--anchors", "8",
                                     "--accumulate", str(N), "--total-steps", "100",
                                     *(x for k, v in RECIPE.items() for x in (k, v)),
                                     "--checkpoint-every", "1", "--keep-last", "2",
                                     "--checkpoint-dir", env.path("ckpt"), "--metrics-dir",
                                     env.path("metrics"), "--progress-ms", "0", "--log-level",
                                     "debug", "--name", "trainer", *slots], env.tmp)
        env.daemons = [queue, target, drafter]
        start_broker(build, env, queue)
        target.start()
        drafter.start()

        # the moment to kill: a checkpoint is written and a batch of the next step acked after
        # it (the checkpoint comes once the closing batch's ack is answered)
        ck_step, total = kill_after_checkpoint(build, env, drafter, 1, 1, failures)
        drafter.start()

        def all_trained():
            st = env.status(build)
            if not drafter.alive() and drafter.wait(1) != 0:
                raise RuntimeError(f"the restarted drafter failed:\n{tail(drafter.log_path)}")
            if st and st["batches_todo"] == 0 and st["batches_inflight"] == 0 and \
                    st["batches_committed"] == st["batches_total"]:
                return st
            return None

        if not wait_until(all_trained, 120, 0.1):
            raise RuntimeError(f"the epoch was not trained within 120 s: {env.status(build)}\n"
                               f"{tail(drafter.log_path)}")
        st = drain_clean(build, env, (drafter, target), total, failures)
        text = drafter.text()
        second = text[text.rfind("==== start"):]
        if not re.search(rf"resumed exactly from \S+step-0*{ck_step} at step {ck_step} .*"
                         rf"{N} batches a step", second):
            failures.append(f"the restarted drafter did not resume from step {ck_step} with "
                            f"{N} batches a step:\n{tail(drafter.log_path, 40)}")
        finals = sorted(d for d in os.listdir(env.path("ckpt")) if d.startswith("step-"))
        final_step = int(finals[-1][5:]) if finals else -1
        want = (total + N - 1) // N
        if final_step != want:
            failures.append(f"final checkpoint step {final_step} != ceil({total} batches / {N})")
        else:
            log("e2e", f"final checkpoint step-{final_step}: {total} batches, {N} a step")
        if st and st["committed_step"] != final_step:
            failures.append(f"broker committed step {st['committed_step']} != final checkpoint "
                            f"{final_step}")
        if finals:
            meta = state_metadata(env.path("ckpt", finals[-1]))
            if meta.get("accumulate") != str(N):
                failures.append(f"the final checkpoint records accumulate "
                                f"{meta.get('accumulate')!r}, not {N}")
            for flag, key in STATE_KEYS.items():
                given = float(drafter.argv[drafter.argv.index(flag) + 1])
                if key not in meta or float(meta[key]) != given:
                    failures.append(f"the final checkpoint records {key} {meta.get(key)!r}, "
                                    f"not {flag} {given:g}")
            with open(env.path("ckpt", finals[-1], "config.json")) as f:
                mask = json.load(f).get("dflash_config", {}).get("mask_token_id")
            if mask != int(RECIPE["--mask-token-id"]):
                failures.append(f"the final checkpoint's config.json has mask_token_id {mask!r}, "
                                f"not --mask-token-id {RECIPE['--mask-token-id']}")
        if f"fresh drafter (init seed {RECIPE['--init-seed']})" not in text:
            failures.append(f"the drafter did not start fresh from --init-seed "
                            f"{RECIPE['--init-seed']}:\n{tail(drafter.log_path, 30)}")
        # the newest record of each step (a step trained again after the rewind appears twice)
        per_step = {}
        with open(env.path("metrics", "metrics.jsonl")) as f:
            for line in f:
                rec = json.loads(line)
                per_step[int(rec["step"])] = int(rec["train/batches"])
        rest = total - N * (want - 1)
        expect = {s: N for s in range(1, want)}
        expect[want] = rest
        if per_step != expect:
            failures.append(f"train/batches per step {per_step}, want {expect}")
        if rest < N and f"closes with the {rest} batch" not in text:
            failures.append(f"the drafter did not say its last step took the {rest} batches "
                            f"left:\n{tail(drafter.log_path, 30)}")
        if "already trained" in text:
            failures.append("an ack was refused as already trained")
        # the run's checkpoint resumed in a group (no --accumulate flag: the checkpoint's 3 wins)
        at = drafter.argv.index("--accumulate")
        argv = drafter.argv[:at] + drafter.argv[at + 2:]
        try:
            group = subprocess.run([*argv, "--group", "g", "--broker-wait-ms", "2000"],
                                   capture_output=True, text=True, timeout=30)
        except subprocess.TimeoutExpired as e:
            group = subprocess.CompletedProcess(e.cmd, -1, "", str(e.stderr or ""))
        if group.returncode != 0 or "3 batches a step" not in group.stderr or \
                "group g epoch 1: rank 0 of 1 in sync at step" not in group.stderr:
            failures.append(f"the checkpoint resumed in a group: exit {group.returncode}, want 0 "
                            f"in group g with 3 batches a step:\n{group.stderr[-2000:]}")
        elif "created by" not in tail(queue.log_path, 400) or \
                "3 micro-steps a step" not in tail(queue.log_path, 400):
            failures.append(f"the broker did not log group g's 3 micro-steps a step:\n"
                            f"{tail(queue.log_path, 30)}")
        stop_broker(queue, failures)
    return report(env, failures)


if __name__ == "__main__":
    sys.exit(main())
