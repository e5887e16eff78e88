#!/usr/bin/env python3
"""e2e_nodata: dflash-target refuses, at its start, a shard set that has nothing to train on, and
scripts/train shows why.

dflash-data no longer writes such data (it leaves out every sequence without an anchor and
refuses data with none), so these shards are written here directly (e2e_common.write_shard,
docs/formats.md's layout), as a shard made by another tool or an older dflash-data would be.
A tiny random Qwen3 target, then:
  1. a shard whose every loss_mask is 0: the target exits 2 before loading the weights, its
     ERROR naming the shard and "no trainable token";
  2. a shard with loss tokens that never come two in a row (alternating masks, one-token
     replies): the target exits 2, its ERROR naming the shard and "no anchor". Both used to
     start: the target ran its forward over the data for every epoch, and only the drafter's
     end said "no step trained" (exit 8);
  3. the same shard plus one sequence with two adjacent loss tokens passes the check: the
     target loads the model and goes on to look for a broker (there is none: exit 1);
  4. scripts/train on the shard of case 2 fails (exit 1) with the target's ERROR on its console;
  5. a shard whose only anchors lie in sequences longer than the last bucket (32: the batch plan
     leaves them out): the target exits 2 before loading the weights, its ERROR counting those
     sequences, giving their lengths against the bound and naming --buckets. It used to start,
     and the drafter's end said "no step trained" (exit 8);
  6. the same shard with a last bucket that holds them (--buckets 32,64) passes the check (no
     broker: exit 1);
  7. a shard dflash-data wrote passes; with one id changed afterwards (a bit
     flipped on disk, the id still inside the vocabulary) the target exits 2 before loading the
     weights, its ERROR naming the shard and the sequence that fails its checksum;
  8. the shard of case 3 trained for real (broker, target, drafter), one sequence a batch, the
     drafter stopping after its first batch (--max-batches 1), which is not the one sequence
     with an anchor: the drafter trains no step and exits 8, saying the batches it got had no
     weighted position, that the data's loss masks leave nothing to train on unless
     --max-batches cut the run short (with a model target the way left to reach that exit: its
     check refuses a set with no anchor at all).
Usage: e2e_nodata.py BUILD_DIR SOURCE_ROOT [--keep]. Exit 0 pass, 1 fail.
"""
import json
import os
import subprocess
import sys

from e2e_common import (Daemon, expect, exits, main_frame, report, run, start_broker,
                        stop_broker, tail, write_shard)


def main():
    root = sys.argv[2]
    catch = (RuntimeError, OSError, subprocess.TimeoutExpired)
    with main_frame("nodata", catch) as (build, env, failures):
        tgt = env.path("target")
        run([build.mkmodel, "--family", "qwen3", "--layers", "6", "--seed", "3", "--out", tgt],
            env.path("tools.log"))
        ids = [(7 * k + 3) % 500 for k in range(20)]
        zero = [(ids, [0] * 20)] * 6
        alternating = [(ids, [k & 1 for k in range(20)])] * 6 + [([5], [1])] * 2
        one_pair = [(ids, [0] * 17 + [1, 1, 0])]
        # anchors only past the last bucket (32): replies of 40 and 50 tokens
        long_only = alternating + [([(5 * k + 1) % 500 for k in range(n)], [0] * 8 + [1] * (n - 8))
                                   for n in (50, 40)]
        write_shard(env.path("zero.shard"), zero, 512)
        write_shard(env.path("noanchor.shard"), alternating, 512)
        write_shard(env.path("onepair.shard"), alternating + one_pair, 512)
        write_shard(env.path("longonly.shard"), long_only, 512)
        target = [build.target, "--model", tgt, "--buckets", "32", "--token-budget", "32",
                  "--max-seqs", "4", "--layers", "3", "--runtime-dir", env.run, "--threads", "1",
                  "--backend", "host", "--broker-wait-ms", "1000", "--name"]

        # 1. no trainable token
        rc, text = exits([*target, "t-zero", "--shards", env.path("zero.shard")],
                         env.path("target-zero.log"))
        expect(failures, "the target on all-zero loss masks", rc, text, 2,
               [r"dflash-target ERROR .*zero\.shard: no trainable token: every loss_mask of its 6 "
                r"sequences is 0"], [r"effective configuration"])

        # 2. loss tokens, no anchor
        rc, text = exits([*target, "t-noanchor", "--shards", env.path("noanchor.shard")],
                         env.path("target-noanchor.log"))
        expect(failures, "the target on loss tokens never two in a row", rc, text, 2,
               [r"dflash-target ERROR .*noanchor\.shard: no anchor: in none of its 8 sequences "
                r"do two loss tokens come in a row", r"at least two in a row"],
               [r"effective configuration"])

        # 3. one anchor candidate in the whole set is enough to start (no broker: exit 1)
        rc, text = exits([*target, "t-onepair", "--shards", env.path("onepair.shard")],
                         env.path("target-onepair.log"))
        expect(failures, "the target on a set with one anchor candidate", rc, text, 1,
               [r"effective configuration"], [r"no anchor", r"no trainable token"])

        # 4. scripts/train on the shard of case 2: the target's reason on the console
        rc, text = exits(["bash", os.path.join(root, "scripts", "train"), "--model", tgt,
                          "--data", env.path("noanchor.shard"), "--out", env.path("run"),
                          "--build", os.path.abspath(sys.argv[1]), "--backend", "host",
                          "--steps", "2", "--draft-layers", "1", "--features", "3",
                          "--block-size", "4", "--anchors", "8", "--max-seqs", "2", "--slots",
                          "2", "--token-budget", "32", "--buckets", "32"],
                         env.path("train.log"), timeout=180)
        expect(failures, "scripts/train on loss tokens never two in a row", rc, text, 1,
               [r"(?m)^\S+ dflash-target ERROR .*noanchor\.shard: no anchor",
                r"train: dflash-target stopped"], [r"train: done"])

        # 5. anchors only in sequences longer than the last bucket: nothing the plan keeps trains
        rc, text = exits([*target, "t-longonly", "--shards", env.path("longonly.shard")],
                         env.path("target-longonly.log"))
        expect(failures, "the target on anchors only past the last bucket", rc, text, 2,
               [r"dflash-target ERROR .*longonly\.shard: no anchor in a sequence the buckets "
                r"keep: the 2 of its 10 sequences that have one \(two loss tokens in a row\) are "
                r"all longer than the last bucket's 32 tokens \(40 to 50 tokens\)",
                r"Give --buckets a last bound of at least 40 \(and --token-budget at least "
                r"that\)"], [r"effective configuration"])

        # 6. a last bucket that holds them: the check passes (no broker: exit 1)
        wide = list(target)
        wide[wide.index("--buckets") + 1] = "32,64"
        wide[wide.index("--token-budget") + 1] = "64"
        rc, text = exits([*wide, "t-wide", "--shards", env.path("longonly.shard")],
                         env.path("target-wide.log"))
        expect(failures, "the target on the same shard with --buckets 32,64", rc, text, 1,
               [r"effective configuration"], [r"no anchor", r"no trainable token"])

        # 7. a shard dflash-data made, one of its ids changed afterwards (a bit flipped on disk,
        #    still inside the vocabulary): its checksum refuses it before the weights load
        with open(env.path("flip.jsonl"), "w") as f:
            for _ in range(4):
                f.write(json.dumps({"input_ids": ids, "loss_mask": [0] * 10 + [1] * 10}) + "\n")
        run([build.data, "--in", env.path("flip.jsonl"), "--out", env.path("flip.shard"),
             "--model", tgt], env.path("tools.log"))
        rc, text = exits([*target, "t-intact", "--shards", env.path("flip.shard")],
                         env.path("target-intact.log"))
        expect(failures, "the target on the shard as dflash-data wrote it", rc, text, 1,
               [r"effective configuration"], [r"checksum"])
        with open(env.path("flip.shard"), "r+b") as f:
            f.seek(64 + 2 * 100)  # sequence 2's first id (records of 20 tokens: 100 bytes)
            first = f.read(1)[0]
            f.seek(64 + 2 * 100)
            f.write(bytes([first ^ 1]))
        rc, text = exits([*target, "t-flip", "--shards", env.path("flip.shard")],
                         env.path("target-flip.log"))
        expect(failures, "the target on the shard with one id changed", rc, text, 2,
               [r"dflash-target ERROR .*flip\.shard: sequence 2 \(20 tokens\) does not match "
                r"the checksum dflash-data recorded"], [r"effective configuration"])

        # 8. a drafter whose only batch has no anchor: no step trained, exit 8
        one_a_batch = list(target)
        one_a_batch[one_a_batch.index("--max-seqs") + 1] = "1"
        one_a_batch[one_a_batch.index("--broker-wait-ms") + 1] = "10000"
        queue = Daemon("queue", [build.queue, "--runtime-dir", env.run, "--min-ready", "1",
                                 "--max-depth", "4"], env.tmp)
        producer = Daemon("target-run", [*one_a_batch, "t-run", "--shards",
                                         env.path("onepair.shard"), "--slots", "1"], env.tmp)
        env.daemons = [queue, producer]
        start_broker(build, env, queue)
        producer.start()
        rc, text = exits([build.drafter, "--train", "--model", tgt, "--name", "d-run",
                          "--runtime-dir", env.run, "--backend", "host", "--threads", "1",
                          "--buckets", "32", "--token-budget", "32", "--max-seqs", "1",
                          "--layers", "3", "--draft-layers", "1", "--block-size", "4",
                          "--anchors", "8", "--max-batches", "1", "--progress-ms", "0"],
                         env.path("drafter-run.log"))
        expect(failures, "a drafter whose one batch has no anchor", rc, text, 8,
               [r"ERROR .*no step trained: every one of the 1 batches this run got had no "
                r"weighted position", r"A run cut short by --max-batches may only have missed",
                r"dflash-drafter: no step trained: the data has nothing to train on"],
               [r"checkpoint: wrote"])
        prc = producer.stop()
        if prc != 0:
            failures.append(f"the target exited {prc} on SIGTERM:\n{tail(producer.log_path)}")
        stop_broker(queue, failures)
    return report(env, failures)


if __name__ == "__main__":
    sys.exit(main())
