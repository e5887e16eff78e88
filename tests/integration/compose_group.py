#!/usr/bin/env python3
"""compose_group: deploy/docker-compose.group.yml's drafter, a data-parallel group in one
container, run as compose would run it, without Docker (cpu backend).

docker-compose.yml + docker-compose.train.yml + docker-compose.group.yml are resolved
(compose_rules.resolve: `docker-compose config`, or PyYAML) with the test's settings given as the
compose variables an operator would put in .env: host backend, a tiny random Qwen3 target and its
shard, DFLASH_DRAFTER_GPUS=0,0. Then the broker, the target and the drafter service's command
(deploy/drafter-group, the image's dflash-drafter-group) run as local processes with each
service's environment; the container paths of their volumes (/models, /data, the checkpoint and
metrics volumes, the runtime dir) point into a temp dir, one directory per volume.

  1. the launcher starts two dflash-drafter processes that form one group of 2 and train: both
     say "rank R of 2 in sync", the broker's group steps each train 2 batches (none 1), every
     output line carries its process's "[rank-K] " prefix, checkpoints go to the checkpoint
     volume's rank-K directories, metrics.jsonl comes from rank-0's process alone;
  2. SIGTERM to the launcher (docker stop) stops both ranks: it exits 0 after them, both end in
     one final state whose step is the newest checkpoint in the rank directories (the final
     checkpoint), no rank is left running;
  3. started again (docker start), the group resumes exactly from the newest checkpoint of
     either rank directory and trains past it: the two directories are swapped before (what
     reordering DFLASH_DRAFTER_GPUS amounts to), so the process that did not write it leads;
  4. one rank SIGKILLed: the launcher SIGTERMs the other and exits 137 (compose's restart:
     on-failure restarts the container); started again, the group resumes from the newest
     checkpoint and trains; a final SIGTERM to launcher, target and broker: each exits 0, and no
     batch was acked twice;
  5. refused before any rank starts (exit 2): a newer checkpoint in no rank's directory (rank-5
     of a longer DFLASH_DRAFTER_GPUS), DFLASH_COMM=nccl with a GPU repeated, no
     DFLASH_DRAFTER_GPUS; one GPU for the checkpoint's step of 2 slots (2 ranks x 1) starts its
     rank with --accumulate 2 (the step kept) and the DFLASH_COMM given as --comm; --help
     prints the header.

Usage: compose_group.py BUILD_DIR [--keep]. Exit 0 pass, 1 fail, 77 skipped (neither
docker-compose nor PyYAML to read the compose files).
"""
import json
import os
import re
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from e2e_common import (Daemon, log, main_frame, report, run, start_broker,  # noqa: E402
                        tail, wait_until)

ROOT = os.path.dirname(os.path.dirname(HERE))
DEPLOY = os.path.join(ROOT, "deploy")
FILES = [os.path.join(DEPLOY, f) for f in
         ("docker-compose.yml", "docker-compose.train.yml", "docker-compose.group.yml")]
LAUNCHER = os.path.join(DEPLOY, "drafter-group")


def say(msg):
    log("compose_group", msg)


def tiny_model(build, env):
    """A random 8-layer Qwen3 target and 48 sequences of 40 tokens in one shard of bucket 64
    (train_group.sh's data); returns the target's config.json."""
    tools = env.path("tools.log")
    models, data = env.path("vol", "models"), env.path("vol", "data")
    os.makedirs(data)
    os.makedirs(models)
    run([build.mkmodel, "--family", "qwen3", "--layers", "8", "--seed", "1", "--out",
         os.path.join(models, "target")], tools)
    with open(env.path("train.jsonl"), "w") as f:
        for s in range(48):
            ids = [(s * 7 + k * 13) % 500 for k in range(40)]
            f.write(json.dumps({"input_ids": ids, "loss_mask": [0] * 8 + [1] * 32}) + "\n")
    run([build.data, "--in", env.path("train.jsonl"), "--out", os.path.join(data, "train.shard"),
         "--model", os.path.join(models, "target"), "--buckets", "64", "--max-len", "64"], tools)
    with open(os.path.join(models, "target", "config.json")) as f:
        return json.load(f)


def compose_vars(cfg):
    """The operator's .env for this test: compose variables, not daemon flags."""
    return {"DFLASH_BACKEND": "host", "DFLASH_TOKEN_BUDGET": "64", "DFLASH_MAX_SEQS": "2",
            "DFLASH_HIDDEN": str(cfg["hidden_size"]), "DFLASH_LAYERS": "3",
            "DFLASH_BUCKETS": "64", "DFLASH_VOCAB_SIZE": str(cfg["vocab_size"]),
            "DFLASH_MIN_READY": "2", "DFLASH_MAX_DEPTH": "6", "DFLASH_SLOTS": "6",
            "DFLASH_EPOCHS": "1000", "DFLASH_LEASE_TIMEOUT_MS": "1500",
            "DFLASH_HEARTBEAT_MS": "300", "DFLASH_TARGET_MODEL": "/models/target",
            "DFLASH_SHARDS": "/data/train.shard", "DFLASH_TARGET_GPU": "0",
            "DFLASH_DRAFTER_GPUS": "0,0", "DFLASH_CHECKPOINT_EVERY": "2", "DFLASH_KEEP_LAST": "4",
            "DFLASH_DRAFT_LAYERS": "1", "DFLASH_BLOCK_SIZE": "4", "DFLASH_ANCHORS": "8",
            "DFLASH_THREADS": "1", "DFLASH_MAX_STEPS": "100000",
            "DFLASH_TOTAL_STEPS": "100000", "DFLASH_LOG_LEVEL": "info"}


def in_sync(text, min_step):
    """The launcher's output text has both processes (rank-0 and rank-1) as the group ranks 0 and
    1 of one epoch of the group of 2, at a step >= min_step."""
    epochs = {}
    for m in re.finditer(r"^\[rank-(\d)\] .*group train epoch (\d+): rank (\d) of 2 in "
                         r"sync at step (\d+)", text, re.M):
        k, epoch, rank, step = m.groups()
        if int(step) >= min_step:
            epochs.setdefault(epoch, {})[k] = rank
    return any(set(v) == {"0", "1"} and set(v.values()) == {"0", "1"} for v in epochs.values())


class Volumes:
    """Each volume of the resolved config as a local directory: a named volume by its name, a
    bind mount by its source's last component; the runtime volume is env's short run dir."""

    def __init__(self, env):
        self.env = env

    def local(self, source):
        if source == "dflash-run":
            return self.env.run
        d = self.env.path("vol", os.path.basename(source.rstrip("/")))
        os.makedirs(d, exist_ok=True)
        return d

    def mounts(self, svc):
        """{container path: local dir} of svc's volumes (short or long syntax)."""
        out = {}
        for v in svc.get("volumes") or []:
            if isinstance(v, dict):
                src, dst = v.get("source", ""), v["target"]
            else:
                src, dst = str(v).split(":")[:2]
            out[dst] = self.local(src)
        return out

    def translate(self, value, mounts):
        """value (comma lists too) with every container path on a mount made local."""
        parts = []
        for p in value.split(","):
            for dst in sorted(mounts, key=len, reverse=True):
                if p == dst or p.startswith(dst.rstrip("/") + "/"):
                    p = mounts[dst] + p[len(dst):]
                    break
            parts.append(p)
        return ",".join(parts)


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    try:
        from compose_rules import resolve
        import yaml  # noqa: F401
    except ImportError:
        say("PyYAML is missing to read the compose files: skipped")
        return 77
    with main_frame("compose-group") as (build, env, failures):
        body(build, env, resolve, failures)
    return report(env, failures)


def body(build, env, resolve, failures):
    cfg = resolve(FILES, compose_vars(tiny_model(build, env)))
    vols = Volumes(env)
    binaries = {"dflash-queue": build.queue, "dflash-target": build.target,
                "dflash-drafter-group": LAUNCHER}
    base_env = {"PATH": os.path.dirname(build.drafter) + ":" + os.environ.get("PATH", "/usr/bin"),
                "HOME": env.tmp, "TMPDIR": env.tmp}
    for var in ("ASAN_OPTIONS", "UBSAN_OPTIONS", "LD_LIBRARY_PATH", "OPENBLAS_CORETYPE"):
        if var in os.environ:
            base_env[var] = os.environ[var]

    def service(name, extra=None):
        """compose's service NAME as a Daemon: its command with our binaries, its environment
        (unset values left out, as compose does) with container paths made local."""
        svc = cfg["services"][name]
        argv = list(svc["command"])
        argv[0] = binaries[argv[0]]
        mounts = vols.mounts(svc)
        e = dict(base_env)
        for k, v in (svc.get("environment") or {}).items():
            if v is not None:
                e[k] = vols.translate(str(v), mounts)
        e.update(extra or {})
        return Daemon(name, argv, env.tmp, e)

    drafter_svc = cfg["services"]["drafter"]
    if drafter_svc["command"] != ["dflash-drafter-group"]:
        raise RuntimeError(f"the drafter service runs {drafter_svc['command']}, not the launcher")
    queue = service("queue")
    target = service("target", {"DFLASH_NAME": f"cgroup{os.getpid()}"})
    group = service("drafter")
    ckpt = group.env["DFLASH_CHECKPOINT_DIR"]
    metrics = group.env["DFLASH_METRICS_DIR"]
    env.daemons = [queue, target, group]
    start_broker(build, env, queue)
    target.start()

    def start_group():
        """Starts the launcher; returns the offset of this start's part of its log."""
        off = os.path.getsize(group.log_path) if os.path.exists(group.log_path) else 0
        group.start()
        return off

    def part(off):
        return group.text()[off:]

    def wait_text(off, pattern, what, deadline_s=120):
        m = wait_until(lambda: re.search(pattern, part(off), re.M) or
                       (not group.alive() and re.search(pattern, part(off), re.M)), deadline_s,
                       0.2)
        if not m:
            raise RuntimeError(f"{what}: no line matching {pattern!r} within {deadline_s} s "
                               f"(launcher {'running' if group.alive() else 'exited'}):\n"
                               f"{tail(group.log_path, 40)}")
        return m

    def wait_in_sync(off, min_step, what):
        if not wait_until(lambda: in_sync(part(off), min_step), 120, 0.2):
            raise RuntimeError(f"{what}: the two processes did not become ranks 0 and 1 of one "
                               f"epoch of the group of 2 at step >= {min_step}:\n"
                               f"{tail(group.log_path, 40)}")

    def checkpoints():
        """[(step, path)] of the checkpoint volume, by step."""
        out = []
        for d in sorted(os.listdir(ckpt)):
            sub = os.path.join(ckpt, d)
            if d.startswith("step-"):
                out.append((int(d[5:]), sub))
            elif os.path.isdir(sub):
                out += [(int(s[5:]), os.path.join(sub, s)) for s in os.listdir(sub)
                        if s.startswith("step-")]
        return sorted(out)

    # a rank's "checkpoint DIR written" line; group 1 its step
    written = rf"^\[rank-\d\] .*checkpoint {re.escape(ckpt)}/rank-\d/step-0*(\d+) written"

    def wait_checkpoint_past(off, step, what):
        ok = wait_until(lambda: any(int(m.group(1)) > step
                                    for m in re.finditer(written, part(off), re.M)), 120, 0.2)
        if not ok:
            raise RuntimeError(f"{what}: no checkpoint past step {step} in {ckpt}/rank-K:\n"
                               f"{tail(group.log_path, 40)}")

    def ranks_running():
        """pid -> argv of every dflash-drafter of this test (its runtime dir in the
        environment)."""
        out = {}
        for p in os.listdir("/proc"):
            if not p.isdigit():
                continue
            try:
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
                with open(f"/proc/{p}/environ", "rb") as f:
                    environ = f.read().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"dflash-drafter") and \
                    f"DFLASH_RUNTIME_DIR={env.run}".encode() in environ:
                out[int(p)] = [a.decode() for a in argv if a]
        return out

    def stop_group(what):
        """SIGTERM to the launcher: exit 0 after both ranks, the final checkpoint reported and
        the newest in the volume; returns its step."""
        off = len(group.text())
        group.proc.send_signal(signal.SIGTERM)
        rc = group.wait(90)
        if rc != 0:
            raise RuntimeError(f"{what}: the launcher exited {rc} on SIGTERM (want 0):\n"
                               f"{tail(group.log_path, 40)}")
        left = ranks_running()
        if left:
            failures.append(f"{what}: ranks still running after the launcher's exit: {left}")
        text = part(off)
        finals = {k: (int(st), h) for k, st, h in re.findall(
            r"^\[rank-(\d)\] .*group train: final state at step (\d+) has hash (\w+)", text, re.M)}
        if sorted(finals) != ["0", "1"] or len(set(finals.values())) != 1:
            raise RuntimeError(f"{what}: the ranks do not end in one final state: {finals}:\n"
                               f"{text[-3000:]}")
        newest = checkpoints()[-1]
        if newest[0] != finals["0"][0]:
            failures.append(f"{what}: the newest checkpoint ({newest[1]}) is not the final state "
                            f"(step {finals['0'][0]})")
        for k in (0, 1):
            if not re.search(rf"^\[rank-{k}\] ", text, re.M):
                failures.append(f"{what}: no line of rank-{k} after the SIGTERM")
        say(f"{what}: SIGTERM: the launcher exited 0 after both ranks; newest checkpoint "
            f"{newest[1]}")
        return newest

    # 1. one group of 2, training
    off = start_group()
    wait_in_sync(off, 0, "start")
    wait_checkpoint_past(off, 3, "start")
    text = part(off)
    # the compose variables reach the ranks: DFLASH_CHECKPOINT_EVERY 2, not the default 500
    # (where docker-compose is missing, resolve() used to drop the pass-through ones)
    first = re.search(written, text, re.M)
    if not first or int(first.group(1)) > 4:
        failures.append("the first checkpoint is not at step 2 or 4 (DFLASH_CHECKPOINT_EVERY 2): "
                        f"{first.group(0) if first else 'none'}")
    lines = [ln for ln in text.splitlines() if not ln.startswith("====")]
    unprefixed = [ln for ln in lines if not re.match(r"\[rank-[01]\] |dflash-drafter-group: ", ln)]
    if unprefixed:
        failures.append(f"lines without a rank prefix: {unprefixed[:3]}")
    qtext = open(queue.log_path, errors="replace").read()
    if not re.search(r"group train: step \d+ done: 2 batches trained", qtext) or \
            re.search(r"group train: step \d+ done: 1 batches trained", qtext):
        failures.append("the broker's group steps are not all of 2 batches:\n" + qtext[-2000:])
    dirs = {os.path.basename(os.path.dirname(p)) for _, p in checkpoints()}
    if not dirs <= {"rank-0", "rank-1"} or not dirs:
        failures.append(f"checkpoints outside {ckpt}/rank-0 and rank-1: {checkpoints()}")
    per_rank = {argv[argv.index("--checkpoint-dir") + 1]: argv
                for argv in ranks_running().values() if "--checkpoint-dir" in argv}
    if sorted(per_rank) != [f"{ckpt}/rank-0", f"{ckpt}/rank-1"]:
        failures.append(f"the ranks' checkpoint directories: {sorted(per_rank)}")
    elif "--metrics-dir" not in per_rank[f"{ckpt}/rank-0"] or \
            "--metrics-dir" in per_rank[f"{ckpt}/rank-1"]:
        failures.append(f"metrics are not rank-0's alone: {per_rank}")
    # GPU 0 twice: NCCL would refuse (one GPU per rank), so the ranks all-reduce over shm (on
    # the host backend auto means shm anyway: the flag itself is what the cuda backend needs)
    for argv in per_rank.values():
        if " ".join(argv).count("--comm shm") != 1 or " ".join(argv).count("--device 0") != 1:
            failures.append(f"a rank on a shared GPU without --device 0 --comm shm: {argv}")
    if not os.path.exists(os.path.join(metrics, "metrics.jsonl")):
        failures.append(f"no metrics.jsonl in {metrics}")
    say(f"group of 2 trains: checkpoints {[p for _, p in checkpoints()][-2:]}")

    # 2. SIGTERM stops both ranks, exit 0, final checkpoint
    step, path = stop_group("first run")

    # 3. started again: resumes from the newest checkpoint of either rank directory. The two
    # directories are swapped first (what reordering DFLASH_DRAFTER_GPUS amounts to), so the
    # newest lies in the directory of the process that did not write it
    r0, r1 = os.path.join(ckpt, "rank-0"), os.path.join(ckpt, "rank-1")
    os.rename(r0, r0 + ".swap")
    os.rename(r1, r0)
    os.rename(r0 + ".swap", r1)
    moved = {r0: r1, r1: r0}[os.path.dirname(path)]
    path = os.path.join(moved, os.path.basename(path))
    off = start_group()
    wait_text(off, rf"^\[rank-\d\] .*resumed exactly from {re.escape(path)} at step {step}\b",
              "restart")
    wait_in_sync(off, step, "restart")
    wait_checkpoint_past(off, step, "restart")
    say(f"restart: the group resumed from {path} (step {step}) and trains past it")

    # 4. a rank SIGKILLed: the launcher stops the other and exits non-zero
    victims = [pid for pid, argv in ranks_running().items() if f"{ckpt}/rank-1" in argv]
    if len(victims) != 1:
        raise RuntimeError(f"rank-1's process not found: {ranks_running()}")
    os.kill(victims[0], signal.SIGKILL)
    rc = group.wait(90)
    if rc != 137:
        raise RuntimeError(f"the launcher exited {rc} after rank-1's SIGKILL (want 137):\n"
                           f"{tail(group.log_path, 40)}")
    if not re.search(r"^dflash-drafter-group: rank-1 \(GPU 0\) exited with status 137: stopping "
                     r"the others", part(off), re.M):
        failures.append("the launcher did not say it stops the others after rank-1 died")
    if ranks_running():
        failures.append(f"ranks left running after a rank's SIGKILL: {ranks_running()}")
    step, path = checkpoints()[-1]
    say(f"SIGKILL of rank-1: the launcher stopped rank-0 and exited 137; newest checkpoint {path}")
    off = start_group()  # compose's restart: on-failure
    wait_text(off, rf"^\[rank-\d\] .*resumed exactly from {re.escape(path)} at step {step}\b",
              "restart after the SIGKILL")
    wait_in_sync(off, step, "restart after the SIGKILL")
    wait_checkpoint_past(off, step, "restart after the SIGKILL")
    stop_group("restart after the SIGKILL")
    for d in (target, queue):
        rc = d.stop(30)
        if rc != 0:
            failures.append(f"the {d.name} exited {rc} on SIGTERM:\n{tail(d.log_path)}")
    for d in (group, target, queue):
        if re.search(r"already trained|trained twice", d.text()):
            failures.append(f"{d.name}: a batch acked twice")
    say("restarted after the SIGKILL: resumed from the newest checkpoint; every daemon exits 0")

    # 5. refused before any rank starts
    stray = os.path.join(ckpt, "rank-5", "step-999999999")
    os.makedirs(stray)
    no_gpus = {k: v for k, v in group.env.items() if k != "DFLASH_DRAFTER_GPUS"}
    cases = [("a newer checkpoint in rank-5", group.env, r"the newest checkpoint, .*rank-5/step-"),
             ("DFLASH_COMM=nccl on a repeated GPU", dict(group.env, DFLASH_COMM="nccl"),
              r"NCCL needs one GPU per rank"),
             ("no DFLASH_DRAFTER_GPUS", no_gpus, "DFLASH_DRAFTER_GPUS is required")]
    for what, penv, want in cases:
        p = subprocess.Popen([LAUNCHER], env=penv, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        try:
            out, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # it started ranks, which wait for the broker
            for pid in ranks_running():
                os.kill(pid, signal.SIGKILL)
            p.kill()
            out, err = p.communicate()
        if p.returncode != 2 or not re.search(want, err) or "[rank-" in out:
            failures.append(f"{what}: exit {p.returncode} (want 2, '{want}' and no rank):\n"
                            f"{err}{out[-1000:]}")
    os.rmdir(stray)
    # the newest checkpoint's step is 2 slots (2 ranks x 1): 1 rank trains both (--accumulate
    # 2, said), where DFLASH_ACCUMULATE (unset: 1) would have halved it
    step, path = checkpoints()[-1]
    if os.path.dirname(path) != r0:  # one rank reads rank-0 alone
        os.rename(r0, r0 + ".swap")
        os.rename(r1, r0)
        os.rename(r0 + ".swap", r1)
        path = os.path.join(r0, os.path.basename(path))
    # (with DFLASH_COMM given: on distinct GPUs the launcher passes it on as --comm; it was
    # dropped, and the ranks ran auto)
    solo = subprocess.Popen([LAUNCHER], env=dict(group.env, DFLASH_DRAFTER_GPUS="0",
                                                 DFLASH_COMM="shm"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started = wait_until(lambda: [a for a in ranks_running().values()
                                  if "--accumulate 2" in " ".join(a)
                                  and "--comm shm" in " ".join(a)], 30)
    solo.send_signal(signal.SIGTERM)
    out, err = solo.communicate(timeout=60)
    if not started or not re.search(rf"resuming {re.escape(path)}: 2 slots a step by its one rank, "
                                    r"from its checkpoint$", err, re.M):
        failures.append(f"1 rank on a step of 2 slots: started with --accumulate 2 and the "
                        f"given --comm shm: {bool(started)}"
                        f"; the launcher said:\n{err}{out[-1000:]}")
    say("a step of 2 slots resumed by 1 rank: --accumulate 2")
    r = subprocess.run([LAUNCHER, "--help"], capture_output=True, text=True, timeout=30)
    if r.returncode != 0 or not r.stdout.startswith("dflash-drafter-group: one data-parallel"):
        failures.append(f"--help: exit {r.returncode}: {r.stdout[:200]}")
    say("refused: a stray newer checkpoint, nccl on a shared GPU, no DFLASH_DRAFTER_GPUS")


if __name__ == "__main__":
    sys.exit(main())
