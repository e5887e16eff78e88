#!/usr/bin/env python3
"""e2e_resume: a SIGKILLed trainer resumes from its last checkpoint and the epoch ends with every
batch in the final model exactly once (DESIGN.md section 5).

A tiny random Qwen3 target, 96 generated sequences (24 batches of 4 in one epoch), then
dflash-queue, dflash-target --model and dflash-drafter --train with --checkpoint-every 6. Once
a checkpoint >= 6 is written and a batch was acked after it (trained, not yet
checkpointed), the drafter is SIGKILLed and started again with the same flags. It must resume
exactly from its newest checkpoint, tell the broker (resume_from) before claiming, and train
the rest. The restart asks for fewer anchors (--anchors 2): an exact resume takes the
checkpoint's settings, its 8 anchors among them, and must plan its blocks for those. It
checkpoints every step (--checkpoint-every 1) and is SIGKILLed again in the narrowest window,
together with the broker (a node lost): it has trained a batch whose ack the broker never got
(the broker is frozen with SIGSTOP until the drafter's log shows a batch consumed and not acked,
then both are killed, and the broker restarts on its journal). A checkpoint written before the
ack would hold that batch while the broker hands it out again: trained twice. A third start
resumes and trains the rest. When the ledger has nothing left to do the drafter's next claim
learns that every batch of the epoch is trained (or, first, the broker is drained); the drafter
saves its final checkpoint, reports it, and exits 0. Three start-ups that must be
refused follow (exit 2, before any
training): a --resume of the older checkpoint into the same --checkpoint-dir, which holds a
newer one (a restart would resume from that one and the retention would delete the new run's),
a --max-steps past the resumed run's 24-step schedule (its learning rate is 0 there; the flags
raise --total-steps with it, as a user extending the run would: a --max-steps past the flags'
own --total-steps is refused before any checkpoint is looked at), and a --checkpoint-dir that
cannot be created (a file stands in its path).

Pass conditions:
  * the last started drafter logs "resumed exactly from .../step-S" and "resume from step S";
  * the ledger (dflash-ctl status --json) ends with every batch of the epoch committed, none to
    do, in flight, trained-uncommitted or quarantined;
  * the final checkpoint's step equals the number of batches in the epoch: each batch was in
    exactly one optimizer step of the final model (the ones trained after S were rewound and
    trained again, not counted twice), and no ack was refused as "already trained"; the
    checkpoint dir keeps exactly 2 of the 3 or more checkpoints written (--keep-last 2);
  * every daemon exits 0; the three refused start-ups exit 2 naming their reason, and so does
    a dflash-target given a captured layer its model lacks (--capture-layers 1,99).
Usage: e2e_resume.py BUILD_DIR [--keep]. Exit 0 pass, 1 fail.
"""
import os
import random
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_common import (Daemon, drain_clean, kill_after_checkpoint, log,  # noqa: E402
                        main_frame, report, start_broker, stop_broker, tail, tiny_training,
                        wait_until)


def main():
    with main_frame("resume") as (build, env, failures):
        slots, queue, target = tiny_training(build, env, 96, "e2eresume")
        common = [build.drafter, "--train", "--model", env.path("target"), "--block-size", "4",
                  "--lr", "3e-3", "--total-steps", "24", *slots]
        ckpt_args = ["--checkpoint-every", "6", "--keep-last", "2", "--checkpoint-dir",
                     env.path("ckpt"), "--metrics-dir", env.path("metrics"), "--progress-ms",
                     "0", "--log-level", "debug"]
        drafter = Daemon("drafter", [*common, "--name", "trainer", "--anchors", "8",
                                     *ckpt_args], env.tmp)
        env.daemons = [queue, target, drafter]
        start_broker(build, env, queue)
        target.start()
        drafter.start()

        # The moment to kill: a checkpoint >= 6 is written and a batch was acked after it (the
        # first ack after the checkpoint line is the checkpoint step's own batch: 2)
        ck_step, total = kill_after_checkpoint(build, env, drafter, 6, 2, failures)
        # the restart asks for fewer anchors: the checkpoint's 8 win and are planned for; it
        # checkpoints every step, so the kill below lands between a checkpoint and an ack if
        # the drafter writes one there
        drafter.argv = [*common, "--name", "trainer", "--anchors", "2", *ckpt_args,
                        "--checkpoint-every", "1"]
        drafter.start()
        kill_waiting_for_ack(build, env, drafter, queue)
        drafter.argv = [*common, "--name", "trainer", "--anchors", "2", *ckpt_args]
        drafter.start()

        def all_trained():
            st = env.status(build)
            # the drafter may end by itself: its last claim learns the epoch is all trained, or
            # it reaches the end of its schedule (--total-steps 24 without --max-steps)
            ends = ("every batch of the target's planned epochs (1) is trained",
                    "the run stops at step 24, the end of its schedule")
            if not drafter.alive() and (drafter.wait(1) != 0 or
                                        not any(e in drafter.text() for e in ends)):
                raise RuntimeError(f"the restarted drafter exited:\n{tail(drafter.log_path)}")
            if st and st["batches_todo"] == 0 and st["batches_inflight"] == 0 and \
                    st["batches_committed"] + st["batches_trained"] == st["batches_total"]:
                return st
            return None

        if not wait_until(all_trained, 120, 0.1):
            raise RuntimeError(f"the epoch was not trained within 120 s: {env.status(build)}")
        st = drain_clean(build, env, (drafter, target), total, failures)
        text = drafter.text()
        second = text[text.rfind("==== start"):]
        m = re.search(r"resumed exactly from (\S+step-0*(\d+)) at step (\d+) \(lr \S+, "
                      r"schedule 24 steps, 8 anchors", second)
        if not m or f"resume from step {m.group(3)}" not in second:
            failures.append("the restarted drafter did not resume from a checkpoint and tell the "
                            f"broker:\n{tail(drafter.log_path, 40)}")
        else:
            log("e2e", f"restarted drafter resumed from {m.group(1)}")
        finals = sorted(d for d in os.listdir(env.path("ckpt")) if d.startswith("step-"))
        final_step = int(finals[-1][5:]) if finals else -1
        written = set(re.findall(r"checkpoint \S+step-0*(\d+) written", text))
        if len(written) < 3 or len(finals) != 2:
            failures.append(f"{len(finals)} checkpoints kept of {len(written)} written (3 or more "
                            f"needed to show it): not --keep-last 2: {finals}")
        skipped = len(re.findall(r"has no weighted position", text))
        if final_step + skipped != total:
            failures.append(f"final checkpoint step {final_step} (+{skipped} skipped batches) != "
                            f"{total} batches in the epoch")
        else:
            log("e2e", f"final checkpoint step-{final_step}: {total} batches, each trained once")
        if st and st["committed_step"] != final_step:
            failures.append(f"broker committed step {st['committed_step']} != final checkpoint "
                            f"{final_step}")
        if "already trained" in text:
            failures.append("an ack was refused as already trained")
        refused_startups(build, env, common, finals, failures)
        stop_broker(queue, failures)
    return report(env, failures)


def kill_waiting_for_ack(build, env, drafter, queue):
    """SIGKILLs the drafter and the broker while the drafter waits for the ack of a batch it
    trained, then restarts the broker. The broker is frozen (SIGSTOP) at random moments, each
    time for a few ms: where the drafter was between the release of a slot and the ack of its
    batch, its log (since its last start) shows a consumed batch after its last acked one soon
    after (with the broker frozen that ack cannot be answered; killed, the broker never reads
    it); anywhere else (claiming, releasing) the broker is thawed and the next moment tried."""
    def own_log():
        text = drafter.text()
        return text[text.rfind("==== start"):]

    def awaiting_ack():
        text = own_log()
        return text.rfind("consumed batch") > text.rfind("acked batch") >= 0

    if not wait_until(lambda: "acked batch" in own_log(), 60, 0.01):
        raise RuntimeError(f"the restarted drafter acked nothing:\n{tail(drafter.log_path)}")
    rng = random.Random(os.getpid())
    end = time.monotonic() + 90
    attempt = 0
    while time.monotonic() < end:
        if not drafter.alive():
            raise RuntimeError(f"the restarted drafter exited:\n{tail(drafter.log_path)}")
        attempt += 1
        # the freeze lands while the drafter trains its next batch (released, not acked: its
        # "training batch" line), within a ms of it: each step also asks the broker for its
        # journal's durability barrier before the checkpoint and reports the checkpoint, so a
        # freeze at a random moment caught the ack's wait rarely, and the run ended first
        seen = own_log().count("training batch")
        wait_until(lambda: own_log().count("training batch") > seen, 5, 0.0005)
        time.sleep(rng.uniform(0, 0.0005))
        os.kill(queue.proc.pid, signal.SIGSTOP)
        caught = wait_until(awaiting_ack, 0.03, 0.002)  # a step takes a few ms
        if caught:  # still waiting 50 ms on: an ack answered just before the freeze is logged
            time.sleep(0.05)  # by then (its reply needs no broker), so this one is not answered
            caught = awaiting_ack()
        if caught:
            drafter.kill9()
            queue.kill9()
            log("e2e", f"SIGKILL drafter waiting for an ack, and the broker (attempt {attempt})")
            start_broker(build, env, queue)
            return
        os.kill(queue.proc.pid, signal.SIGCONT)
    raise RuntimeError(f"never caught the drafter waiting for an ack in {attempt} attempts")


def refused_startups(build, env, common, finals, failures):
    """Start-ups the drafter must refuse (exit 2, before it trains) with their reason."""
    if len(finals) < 2:
        failures.append(f"expected two checkpoints (--keep-last 2), found {finals}")
        return
    older, newest = env.path("ckpt", finals[0]), env.path("ckpt", finals[-1])
    cases = [("a --resume of an older checkpoint into a --checkpoint-dir holding a newer one",
              ["--resume", older, "--checkpoint-dir", env.path("ckpt")], "holds the newer"),
             ("a --max-steps past the resumed run's schedule",
              ["--resume", newest, "--checkpoint-dir", env.path("ckpt-extended"),
               "--total-steps", "30", "--max-steps", "30"],
              "past the resumed run's schedule of 24 steps")]
    # a --checkpoint-dir that cannot be made is found at start-up, not at the first checkpoint
    # (which used to fail then, exit 1, losing every step trained before it)
    blocker = env.path("not-a-dir")
    open(blocker, "w").close()
    cases.append(("a --checkpoint-dir that cannot be created (a file is in the way)",
                  ["--checkpoint-dir", os.path.join(blocker, "ckpt")], "cannot create"))
    for what, args, reason in cases:
        p = subprocess.run([*common, "--name", "refused", *args], capture_output=True,
                           text=True, timeout=60, cwd=env.tmp)
        out = p.stdout + p.stderr
        if p.returncode != 2 or reason not in out:
            failures.append(f"{what}: exit {p.returncode}, expected 2 with '{reason}':\n"
                            f"{out[-2000:]}")
        else:
            log("e2e", f"refused as expected: {what}")
    # the target: a captured layer its model lacks is bad configuration (exit 2), found from
    # config.json before the load (it was the load's failure: exit 1)
    p = subprocess.run([build.target, "--name", "refused-target", "--model", env.path("target"),
                        "--shards", env.path("train.shard"), "--runtime-dir", env.run,
                        "--backend", "host", "--buckets", "32", "--capture-layers", "1,99"],
                       capture_output=True, text=True, timeout=60, cwd=env.tmp)
    out = p.stdout + p.stderr
    if p.returncode != 2 or "captured layer id 99 outside [0, 6)" not in out:
        failures.append(f"dflash-target --capture-layers 1,99 on a 6-layer target: exit "
                        f"{p.returncode}, expected 2 naming the id:\n{out[-2000:]}")
    else:
        log("e2e", "refused as expected: dflash-target --capture-layers 1,99")


if __name__ == "__main__":
    sys.exit(main())
