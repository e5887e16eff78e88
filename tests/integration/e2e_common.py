"""e2e_common: what the end-to-end tests share: the real binaries of a build tree, daemons started
as child processes with their logs in a temp dir, a private runtime dir for the ipc:// sockets,
dflash-ctl status as JSON, and waits for conditions with deadlines (never fixed sleeps).

Used by the e2e_*.py tests and compose_group.py: main_frame is their main()'s frame (build, env,
failures, cleanup); start_broker and stop_broker start the queue and want it to stop cleanly;
tiny_training, kill_after_checkpoint and drain_clean are the resume tests' (e2e_resume.py,
e2e_accumulate.py) real training setup, SIGKILL moment and end; write_shard makes shards
dflash-data refuses to make, for the checks behind it (e2e_nodata.py, e2e_diverge.py); exits
and expect run a program that must stop with a given status and output (e2e_nodata.py,
e2e_diverge.py).
"""
import contextlib
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time


class Build:
    def __init__(self, build_dir):
        b = os.path.abspath(build_dir)
        self.queue = os.path.join(b, "services", "queue", "dflash-queue")
        self.target = os.path.join(b, "services", "target", "dflash-target")
        self.drafter = os.path.join(b, "services", "drafter", "dflash-drafter")
        self.ctl = os.path.join(b, "tools", "dflash-ctl")
        self.mkmodel = os.path.join(b, "tools", "dflash-mkmodel")
        self.gen = os.path.join(b, "tools", "dflash-gen")
        self.data = os.path.join(b, "tools", "dflash-data")


def write_shard(path, seqs, vocab=0):
    """Writes seqs, a list of (ids, loss_mask) pairs, as a shard in docs/formats.md's layout: a
    64-byte header, records (int32 ids, uint8 mask, zero padding to 4 bytes), the 8-aligned index
    of {u64 offset, u32 len, u32 0} last: version 1, without the records' checksums, which the
    reader still reads. For data that dflash-data refuses to write (no anchor, no trainable
    token); the target's reader checks every invariant of it at open."""
    records, index = bytearray(), []
    for ids, mask in seqs:
        index.append((64 + len(records), len(ids)))
        records += struct.pack(f"<{len(ids)}i", *ids) + bytes(mask)
        records += bytes(-len(records) % 4)
    records += bytes(-(64 + len(records)) % 8)
    lens = [n for _, n in index]
    header = struct.pack("<8sIIQQQII16x", b"DFSHARD\0", 1, 64, len(seqs), sum(lens),
                         64 + len(records), vocab, max(lens, default=0))
    with open(path, "wb") as f:
        f.write(header + records + b"".join(struct.pack("<QII", o, n, 0) for o, n in index))


def log(name, msg):
    print(f"[{name} {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(argv, logpath):
    """Runs a tool to completion; raises with the log tail when it fails."""
    with open(logpath, "a") as f:
        rc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise RuntimeError(f"{os.path.basename(argv[0])} failed ({rc}):\n{tail(logpath)}")


def tail(path, n=25):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return "(no log)"


class Daemon:
    """One daemon: argv, its log file, start/kill/terminate; env: its whole environment (None:
    this process's)."""

    def __init__(self, name, argv, logdir, env=None):
        self.name, self.argv, self.env = name, argv, env
        self.log_path = os.path.join(logdir, f"{name}.log")
        self.proc = None

    def start(self):
        with open(self.log_path, "a") as f:
            f.write(f"==== start: {' '.join(self.argv)}\n")
            f.flush()
            env = dict(os.environ) if self.env is None else self.env
            self.proc = subprocess.Popen(self.argv, stdout=f, stderr=subprocess.STDOUT, env=env)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self, timeout=20):
        """SIGTERM and wait; returns the exit status (-9 if it had to be killed)."""
        if not self.proc:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return -9
        return self.proc.returncode

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def text(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()


def report(env, failures):
    """Logs every failure, where the logs were kept, and PASS or FAILED; the exit status."""
    for f in failures:
        log("e2e", f"FAIL: {f}")
    if failures:
        log("e2e", f"logs kept in {env.tmp}")
    log("e2e", "PASS" if not failures else "FAILED")
    return 1 if failures else 0


def wait_until(cond, deadline_s, step=0.1):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(step)
    return None


def run_ctl(ctl_path, runtime_dir, *args, timeout=5):
    """dflash-ctl ARGS on runtime_dir, each request waiting up to 1 s: (exit status, stdout);
    (2, "") when the process itself outlasted timeout seconds (a slow start under load)."""
    try:
        r = subprocess.run([ctl_path, "--runtime-dir", runtime_dir, "--timeout-ms", "1000", *args],
                           capture_output=True, text=True, timeout=timeout)
        return r.returncode, r.stdout
    except subprocess.TimeoutExpired:
        return 2, ""


class Env:
    """A temp dir (logs, data, checkpoints) and a short private runtime dir (sockets)."""

    def __init__(self, prefix):
        self.tmp = tempfile.mkdtemp(prefix=f"dflash-{prefix}-")
        self.run = tempfile.mkdtemp(prefix="dfr-")  # short: ipc paths are limited to ~100 bytes
        os.chmod(self.run, 0o700)
        self.daemons = []

    def path(self, *p):
        return os.path.join(self.tmp, *p)

    def ctl(self, build, *args, timeout=5):
        return run_ctl(build.ctl, self.run, *args, timeout=timeout)

    def status(self, build):
        rc, out = self.ctl(build, "status", "--json")
        if rc != 0:
            return None
        try:
            return json.loads(out)
        except json.JSONDecodeError:
            return None

    def cleanup(self, keep):
        for d in reversed(self.daemons):
            if d.alive():
                d.stop()
        shutil.rmtree(self.run, ignore_errors=True)
        if not keep:
            shutil.rmtree(self.tmp, ignore_errors=True)


def exits(argv, logpath, timeout=120):
    """Runs argv to completion: its exit status and its output (stdout and stderr, also kept in
    logpath)."""
    with open(logpath, "w") as f:
        rc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode
    with open(logpath, errors="replace") as f:
        return rc, f.read()


def expect(failures, what, rc, text, want, present, absent=()):
    """A run (exits' rc and text) that must exit want with every regex of present in its output
    and none of absent: appends to failures what differs (with the output's tail), else logs
    it as ok."""
    missing = [p for p in present if not re.search(p, text)]
    wrong = [p for p in absent if re.search(p, text)]
    if rc != want or missing or wrong:
        failures.append(f"{what}: exit {rc} (want {want}), missing {missing}, unwanted {wrong}:"
                        f"\n{text[-2000:]}")
    else:
        log("e2e", f"ok: {what} exits {rc}")


@contextlib.contextmanager
def main_frame(prefix, catch=(RuntimeError,)):
    """The frame of an end-to-end test's main(): yields (build, env, failures) for the build
    tree sys.argv[1], a new Env(prefix) and an empty list. An exception of a catch type ends
    the body as one more failure; then the env is cleaned up (its temp dir kept after a failure
    or with --keep). main() returns report(env, failures) after it."""
    build = Build(sys.argv[1])
    keep = "--keep" in sys.argv
    env = Env(prefix)
    failures = []
    try:
        yield build, env, failures
    except catch as e:
        failures.append(str(e))
    finally:
        env.cleanup(keep or bool(failures))


def tiny_training(build, env, n_seqs, name, backend="host"):
    """The small real training setup of the resume-style tests: a random 6-layer Qwen3 target
    (dflash-mkmodel), n_seqs generated sequences (dflash-gen) in one shard of bucket 32
    (dflash-data), and a broker with a journal (min-ready 1, max-depth 4, lease timeout 1.5 s,
    heartbeats every 300 ms) and a target (3 slots, 1 epoch) on env's runtime dir. Returns the
    slot options the drafter must share, the queue and the target Daemon (not started)."""
    tools_log = env.path("tools.log")
    run([build.mkmodel, "--family", "qwen3", "--layers", "6", "--seed", "3", "--out",
         env.path("target")], tools_log)
    run([build.gen, "--model", env.path("target"), "--out", env.path("train.jsonl"), "--n",
         str(n_seqs), "--seed", "5", "--greedy", "--prompt-max", "12", "--max-new", "20",
         "--threads", "1"], tools_log)
    run([build.data, "--in", env.path("train.jsonl"), "--out", env.path("train.shard"),
         "--model", env.path("target"), "--buckets", "32", "--strict"], tools_log)
    slots = ["--buckets", "32", "--token-budget", "128", "--max-seqs", "4", "--layers", "3",
             "--runtime-dir", env.run, "--threads", "1", "--backend", backend,
             "--timeout-ms", "1000"]
    queue = Daemon("queue", [build.queue, "--runtime-dir", env.run, "--journal",
                             env.path("queue.journal"), "--min-ready", "1", "--max-depth",
                             "4", "--lease-timeout-ms", "1500", "--heartbeat-ms", "300"],
                   env.tmp)
    target = Daemon("target", [build.target, "--name", f"{name}{os.getpid()}", "--model",
                               env.path("target"), "--shards", env.path("train.shard"),
                               "--slots", "3", "--epochs", "1", *slots], env.tmp)
    return slots, queue, target


# How long a started broker may take to answer its first ping: a bound, not a timing (under
# ASan on a loaded machine a broker took 4 s to log its first line, up to 15 s under ctest -j6
# on 2 cores, and each ping is a process of its own). harness.h's H_BROKER_UP_MS is the same.
BROKER_UP_S = 30


def broker_answers(ctl):
    """True once ctl("ping") (a run_ctl-like call: (status, stdout)) exits 0, within
    BROKER_UP_S."""
    return bool(wait_until(lambda: ctl("ping")[0] == 0, BROKER_UP_S))


def start_broker(build, env, queue):
    """Starts queue and waits for it to answer ping (RuntimeError after BROKER_UP_S)."""
    queue.start()
    if not broker_answers(lambda *a: env.ctl(build, *a)):
        raise RuntimeError(f"the broker did not answer ping within {BROKER_UP_S} s:\n" +
                           tail(queue.log_path))


def stop_broker(queue, failures):
    """SIGTERMs queue (start_broker's) and appends to failures unless it exits 0."""
    qrc = queue.stop()
    if qrc != 0:
        failures.append(f"the broker exited {qrc} on SIGTERM:\n{tail(queue.log_path)}")


def acked_past_checkpoint(drafter, min_step, min_acks):
    """The step of the drafter's newest checkpoint once it is >= min_step and its debug log shows
    min_acks batches acked after it (the moment a kill leaves trained batches no checkpoint
    holds), else None; RuntimeError when the drafter exited. Reading its log is fast enough to
    catch the moment (a dflash-ctl call per poll is not, under ASan)."""
    if not drafter.alive():
        raise RuntimeError(f"the drafter exited early:\n{tail(drafter.log_path)}")
    text = drafter.text()
    ck = list(re.finditer(r"checkpoint \S+step-0*(\d+) written", text))
    if ck and int(ck[-1].group(1)) >= min_step and \
            text[ck[-1].end():].count("acked batch") >= min_acks:
        return int(ck[-1].group(1))
    return None


def drain_clean(build, env, daemons, total, failures):
    """Drains the broker, waits for each of daemons (the drafter, the target) to exit 0, and
    checks the ledger is clean: all total batches committed, none to do, in flight, trained
    uncommitted or quarantined. Appends to failures; returns the final status (or None)."""
    env.ctl(build, "drain")
    for d in daemons:
        rc = d.wait(60)
        if rc != 0:
            failures.append(f"the {d.name} exited {rc} after the drain:\n{tail(d.log_path)}")
    st = env.status(build)
    log("e2e", f"ledger: {st}")
    if not st or st["batches_committed"] != total or st["batches_todo"] or \
            st["batches_inflight"] or st["batches_trained"] or st["quarantined"]:
        failures.append(f"ledger not clean after the drain: {st}")
    return st


def wait_acked_past_checkpoint(drafter, min_step, min_acks, deadline_s=120):
    """acked_past_checkpoint's step, polled every 2 ms; RuntimeError with the drafter's log tail
    when it does not come within deadline_s."""
    step = wait_until(lambda: acked_past_checkpoint(drafter, min_step, min_acks), deadline_s,
                      0.002)
    if not step:
        raise RuntimeError(f"no {min_acks} batch(es) acked after a checkpoint >= {min_step} "
                           f"within {deadline_s} s:\n{tail(drafter.log_path)}")
    return step


def kill_after_checkpoint(build, env, drafter, min_step, min_acks, failures):
    """SIGKILLs the drafter at wait_acked_past_checkpoint's moment (a checkpoint >= min_step,
    min_acks batches acked after it) and logs what the broker holds then; appends to failures
    when it holds no batch trained after its committed step (the rewind a restart must do would
    not be exercised). Returns the checkpoint's step and the epoch's batch count."""
    ck_step = wait_acked_past_checkpoint(drafter, min_step, min_acks)
    drafter.kill9()
    st = env.status(build)
    total = int(st["batches_total"])
    log("e2e", f"SIGKILL drafter after checkpoint step {ck_step}: the broker has committed "
        f"step {st['committed_step']:.0f} and holds {st['batches_trained']:.0f} batches "
        f"trained after it (epoch has {total})")
    if st["batches_trained"] == 0:
        failures.append("no batch was held as trained after the last commit when the drafter "
                        "was killed: the rewind was not exercised")
    return ck_step, total
