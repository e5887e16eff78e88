#!/usr/bin/env python3
"""e2e_verify_model: issue 4's end-to-end CPU check of the data plane with a real target.

dflash-mkmodel writes a tiny random Qwen3 (6 layers: DFlash's rule captures layers 1, 2, 3);
dflash-gen writes sequences of two length ranges with it and dflash-data makes one shard (two
buckets, so two slot shapes); then dflash-queue, dflash-target --model (the real forward, host
pool) and `dflash-drafter --verify-model` run as daemons. The drafter recomputes, for each of
--verify-slots slots, the batch the slot names from the same shard and batch plan and a direct
single-process forward, and compares arrays and every captured (token, layer) row.

Pass conditions:
  * a training drafter that does not fit the target (captured-layer count, hidden size, layer
    ids) exits 2 at start-up with a message naming both values;
  * the verifying drafter exits 0 after checking 16 slots, each logged as matching, among them
    both buckets' (16 rather than 6: the broker's bucket shares gave 6 grants of the long bucket
    alone in about 1 run of 10);
  * a second verifier given a DIFFERENT target (other seed) exits 3 on the first slot: the check
    really compares hidden states (a test that cannot fail is a defect);
  * the target and the broker exit 0 after a drain / SIGTERM.
Usage: e2e_verify_model.py BUILD_DIR [--keep]. Exit 0 pass, 1 fail.
"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_common import (Daemon, log, main_frame, report, run, start_broker,  # noqa: E402
                        stop_broker, tail)

NAME = "e2e-verify"


def main():
    with main_frame("verify") as (build, env, failures):
        tools_log = env.path("tools.log")
        run([build.mkmodel, "--family", "qwen3", "--layers", "6", "--seed", "3", "--out",
             env.path("target")], tools_log)
        run([build.mkmodel, "--family", "qwen3", "--layers", "6", "--seed", "4", "--out",
             env.path("other")], tools_log)
        run([build.gen, "--model", env.path("target"), "--out", env.path("short.jsonl"), "--n",
             "24", "--seed", "5", "--prompt-max", "12", "--max-new", "8", "--threads", "1"],
            tools_log)
        run([build.gen, "--model", env.path("target"), "--out", env.path("long.jsonl"), "--n",
             "24", "--seed", "6", "--prompt-max", "16", "--max-new", "40", "--threads", "1"],
            tools_log)
        with open(env.path("all.jsonl"), "w") as out:
            for p in ("short.jsonl", "long.jsonl"):
                out.write(open(env.path(p)).read())
        run([build.data, "--in", env.path("all.jsonl"), "--out", env.path("train.shard"),
             "--model", env.path("target"), "--buckets", "20,56", "--strict"], tools_log)

        slots = ["--buckets", "20,56", "--token-budget", "128", "--max-seqs", "8", "--layers",
                 "3", "--runtime-dir", env.run, "--threads", "1", "--backend", "host"]
        # a drafter that does not fit the target is refused at start-up, naming both values
        for extra, want in ((["--capture-layers", "1,2"], "names 2 target layers but the slots "
                             "hold 3"),
                            (["--hidden", "32"], "--hidden 32 does not match the target's "
                             "hidden_size 64"),
                            (["--capture-layers", "1,2,9"], "9 outside the target's 6 layers")):
            r = subprocess.run([build.drafter, "--train", "--model", env.path("target"), *slots,
                                *extra, "--broker-wait-ms", "1000"], capture_output=True,
                               text=True, timeout=60)
            if r.returncode != 2 or want not in r.stderr:
                failures.append(f"drafter {extra}: exit {r.returncode}, wanted 2 and '{want}':\n"
                                f"{r.stderr[-1500:]}")
        queue = Daemon("queue", [build.queue, "--runtime-dir", env.run, "--journal", "none",
                                 "--min-ready", "1", "--max-depth", "6"], env.tmp)
        target = Daemon("target", [build.target, "--name", f"{NAME}{os.getpid()}", "--model",
                                   env.path("target"), "--shards", env.path("train.shard"),
                                   "--seed", "7", "--slots", "4", "--epochs", "3", *slots],
                        env.tmp)
        good = Daemon("verifier", [build.drafter, "--verify-model", "--model", env.path("target"),
                                   "--shards", env.path("train.shard"), "--seed", "7",
                                   "--verify-slots", "16", "--name", "verifier", *slots], env.tmp)
        bad = Daemon("wrong-model", [build.drafter, "--verify-model", "--model",
                                     env.path("other"), "--shards", env.path("train.shard"),
                                     "--seed", "7", "--verify-slots", "2", "--name", "wrong",
                                     *slots], env.tmp)
        env.daemons = [queue, target, good, bad]
        start_broker(build, env, queue)
        target.start()
        good.start()
        rc = good.wait(120)
        if rc != 0:
            failures.append(f"the verifier exited {rc}:\n{tail(good.log_path)}")
        else:
            text = good.text()
            matched = re.findall(r"match a direct forward \(max relative error ([0-9.e+-]+)",
                                 text)
            log("e2e", f"verifier: {len(matched)} slots matched a direct forward, errors "
                f"{matched}")
            if len(matched) != 16 or "16 slots verified" not in text:
                failures.append(f"expected 16 verified slots:\n{tail(good.log_path)}")
            # both buckets, so both slot shapes, were among them
            buckets = set(re.findall(r"batch \(\d+, (\d+), \d+\): \d+ tokens, \d+ sequences "
                                     r"match a direct forward", text))
            if buckets != {"0", "1"}:
                failures.append(f"the verified slots cover buckets {sorted(buckets)}, want "
                                f"both (0 and 1):\n{tail(good.log_path)}")
        bad.start()
        rc = bad.wait(120)
        if rc != 3 or "VERIFY FAILED" not in bad.text():
            failures.append(f"a verifier with the wrong target exited {rc}, not 3:\n"
                            f"{tail(bad.log_path)}")
        else:
            log("e2e", "a verifier holding a different target refuses the first slot (exit 3)")
        env.ctl(build, "drain")
        trc = target.wait(30)
        if trc != 0:
            failures.append(f"the target exited {trc} after the drain:\n{tail(target.log_path)}")
        stop_broker(queue, failures)
    return report(env, failures)


if __name__ == "__main__":
    sys.exit(main())
