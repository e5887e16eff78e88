#!/usr/bin/env python3
"""chaos_compose: the deployment, run as compose would run it, survives SIGKILL of any daemon.

Reads deploy/docker-compose.yml resolved by `docker-compose config` (with the test's settings
given as the compose variables an operator would put in .env: host backend, small slots, a
paced synthetic target), then runs each service's command line with its environment as local
processes: the broker, the synthetic target and two verifying drafters (compose's
`--scale drafter=2`). Paths that would be volumes (runtime dir, journal) point into a temp dir.

For about a minute and a half a chaos driver SIGKILLs a random daemon every second or two and
restarts it after a short pause, one at a time, as compose's restart policy would, until each of
the four has been killed at least --min-kills times. Then it waits for the broker's ledger to
report the epoch fully committed and shuts everything down with SIGTERM.

Pass conditions (each a user-visible promise of DESIGN.md section 5):
  * no drafter ever reports a corrupt or mismatched batch (exit 3 / "VERIFY FAILED"),
  * the ledger (dflash-ctl status --json) has every batch committed, none to do, in flight or
    quarantined, and no drafter saw a second ack of a batch refused ("already trained"),
  * no daemon ends on its own with a non-zero status (a crash, a sanitizer's abort), during the
    chaos or after it; ending with 0 (a drafter that saw the epoch drained) is allowed,
  * every daemon exits 0 on SIGTERM, and no /dev/shm segment of the pool is left behind.

Usage: chaos_compose.py BUILD_DIR [--seconds 90] [--min-kills 10] [--seed N] [--keep]
       [--batches-per-bucket N] [--target-rate R] [--drafter-rate R] [--backend host|cuda]
       [--drafter-gpu N]
With --seconds 0 --min-kills 0 it is a plain smoke test of the deployment (no kills).
Exit 0 pass, 1 fail, 77 skipped (no docker-compose and no PyYAML to read the compose file, or
--backend cuda without a GPU).
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from e2e_common import BROKER_UP_S, broker_answers, run_ctl, wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMPOSE = os.path.join(ROOT, "deploy", "docker-compose.yml")

# The operator's .env for this test: compose variables, not daemon flags.
TEST_VARS = {
    "DFLASH_BACKEND": "host",
    "DFLASH_TOKEN_BUDGET": "1024",
    "DFLASH_MAX_SEQS": "16",
    "DFLASH_HIDDEN": "64",
    "DFLASH_LAYERS": "3",
    "DFLASH_BUCKETS": "128,256,512,1024",
    "DFLASH_VOCAB_SIZE": "32000",
    "DFLASH_MIN_READY": "2",
    "DFLASH_MAX_DEPTH": "8",
    "DFLASH_LEASE_TIMEOUT_MS": "1500",
    "DFLASH_MAX_REDELIVERIES": "1000",
    "DFLASH_HEARTBEAT_MS": "300",
    "DFLASH_LIVENESS": "3",
    "DFLASH_SLOTS": "8",
    "DFLASH_EPOCHS": "1",
    "DFLASH_TARGET_RATE": "40",
    "DFLASH_DRAFTER_RATE": "30",
    "DFLASH_VERIFY": "true",
    "DFLASH_LOG_LEVEL": "info",
}


def log(msg):
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def resolve_compose(env_vars):
    """The resolved compose config as a dict: docker-compose if present, else PyYAML plus our
    own ${VAR:-default} interpolation (the subset the file uses)."""
    env = dict(os.environ)
    env.update(env_vars)
    if shutil.which("docker-compose"):
        out = subprocess.run(["docker-compose", "-f", COMPOSE, "config"], env=env,
                             capture_output=True, text=True, check=True).stdout
        import yaml
        return yaml.safe_load(out)
    try:
        import yaml
    except ImportError:
        return None
    text = open(COMPOSE).read()
    text = re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m.group(1), m.group(2)), text)
    cfg = yaml.safe_load(text)
    for svc in cfg["services"].values():  # merge keys are resolved by PyYAML already
        svc["environment"] = {k: str(v) for k, v in svc.get("environment", {}).items()}
    return cfg


class Service:
    """One daemon as compose runs it: a command line, an environment, a restart count."""

    def __init__(self, name, argv, env, logdir):
        self.name, self.argv, self.env = name, argv, env
        self.log_path = os.path.join(logdir, f"{name}.log")
        self.proc = None
        self.kills = 0
        self.starts = 0
        self.bad_exits = []  # non-zero statuses of ends on its own (each one a failure)

    def start(self):
        logf = open(self.log_path, "a")
        logf.write(f"==== start {self.starts} ====\n")
        logf.flush()
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=logf, stderr=subprocess.STDOUT)
        logf.close()
        self.starts += 1

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.kills += 1

    def exited(self):
        """The exit status if the process ended on its own, else None."""
        return self.proc.poll() if self.proc else None

    def started_logging(self):
        """True once the current start has written a line of its own to the log."""
        text = self.log_text()
        marker = f"==== start {self.starts - 1} ====\n"
        i = text.rfind(marker)
        return i >= 0 and len(text) > i + len(marker)

    def log_text(self):
        if not os.path.exists(self.log_path):  # never started
            return ""
        with open(self.log_path, errors="replace") as f:
            return f.read()


def ctl(build, runtime_dir, *args, timeout=5):
    return run_ctl(os.path.join(build, "tools", "dflash-ctl"), runtime_dir, *args, timeout=timeout)


def status(build, runtime_dir):
    try:
        rc, out = ctl(build, runtime_dir, "status", "--json")
        return json.loads(out) if rc == 0 else None
    except (subprocess.TimeoutExpired, json.JSONDecodeError):
        return None


def gpu_visible():
    """True when nvidia-smi lists a GPU (the cuda backend's daemons would exit 1 without one)."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--seconds", type=float, default=90)
    ap.add_argument("--min-kills", type=int, default=10)
    ap.add_argument("--batches-per-bucket", type=int, default=650)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--target-rate", default=TEST_VARS["DFLASH_TARGET_RATE"],
                    help="synthetic target batches/s (0 = unpaced)")
    ap.add_argument("--drafter-rate", default=TEST_VARS["DFLASH_DRAFTER_RATE"],
                    help="verifier batches/s each (0 = unpaced)")
    ap.add_argument("--backend", default="host", choices=["host", "cuda"],
                    help="cuda: the GPU machine (target on GPU 0, drafters on --drafter-gpu)")
    ap.add_argument("--drafter-gpu", default="0")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir with the logs")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    if a.backend == "cuda" and not gpu_visible():
        log("--backend cuda needs a GPU and none is visible (nvidia-smi -L): skipped")
        return 77
    rng = random.Random(a.seed)
    log(f"seed {a.seed}")

    tmp = tempfile.mkdtemp(prefix="dflash-chaos-")
    run_dir = os.path.join(tmp, "run")
    os.mkdir(run_dir, 0o700)
    pool_name = f"chaos{os.getpid()}"
    test_vars = dict(TEST_VARS, DFLASH_BATCHES_PER_BUCKET=str(a.batches_per_bucket),
                     DFLASH_TARGET_RATE=str(a.target_rate), DFLASH_DRAFTER_RATE=str(a.drafter_rate),
                     DFLASH_BACKEND=a.backend, DFLASH_TARGET_GPU="0",
                     DFLASH_DRAFTER_GPU=a.drafter_gpu)
    cfg = resolve_compose(test_vars)
    if cfg is None:
        log("neither docker-compose nor PyYAML is available to read the compose file: skipped")
        return 77

    binaries = {"dflash-queue": os.path.join(build, "services", "queue", "dflash-queue"),
                "dflash-target": os.path.join(build, "services", "target", "dflash-target"),
                "dflash-drafter": os.path.join(build, "services", "drafter", "dflash-drafter")}
    base_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tmp}
    for var in ("ASAN_OPTIONS", "UBSAN_OPTIONS", "LD_LIBRARY_PATH", "OPENBLAS_CORETYPE"):
        if var in os.environ:  # the loader path carries the GPU machine's devlibs
            base_env[var] = os.environ[var]
    # what the volumes are on this machine, and per-instance names compose would get from
    # container hostnames
    local = {"DFLASH_RUNTIME_DIR": run_dir, "DFLASH_JOURNAL": os.path.join(tmp, "queue.journal"),
             "DFLASH_PROGRESS_MS": "5000", "DFLASH_TIMEOUT_MS": "500", "DFLASH_BROKER_WAIT_MS": "0"}

    def service(name, compose_name, extra=None):
        svc = cfg["services"][compose_name]
        argv = list(svc["command"])
        argv[0] = binaries[argv[0]]
        env = dict(base_env)
        env.update({k: str(v) for k, v in svc.get("environment", {}).items()})
        env.update(local)
        if compose_name == "queue":  # flags the broker does not have
            for k in ("DFLASH_PROGRESS_MS", "DFLASH_TIMEOUT_MS", "DFLASH_BROKER_WAIT_MS"):
                env.pop(k)
        else:
            env.pop("DFLASH_JOURNAL")
        env.update(extra or {})
        return Service(name, argv, env, tmp)

    svcs = [service("queue", "queue"),
            service("target", "target", {"DFLASH_NAME": pool_name}),
            service("drafter.1", "drafter", {"DFLASH_NAME": "chaos-d1", "DFLASH_LOG_LEVEL": "debug"}),
            service("drafter.2", "drafter", {"DFLASH_NAME": "chaos-d2", "DFLASH_LOG_LEVEL": "debug"})]
    queue = svcs[0]
    failures = []
    try:
        queue.start()
        if not broker_answers(lambda *a: ctl(build, run_dir, *a)):
            failures.append(f"the broker did not answer ping within {BROKER_UP_S} s")
            raise RuntimeError
        for s in svcs[1:]:
            s.start()

        # chaos: one kill at a time, restart after a short pause (compose restart)
        t_end = time.monotonic() + a.seconds
        while True:
            mink = min(s.kills for s in svcs)
            if time.monotonic() >= t_end and mink >= a.min_kills:
                break
            # the kills' own pace: each restart waits for the daemon (an ASan broker took up to
            # 15 s to start under ctest -j6 on 2 cores, and 120 s more did not reach 10 kills)
            if time.monotonic() >= t_end + 300:
                failures.append(f"could not reach {a.min_kills} kills of each daemon")
                break
            time.sleep(rng.uniform(0.5, 1.6))
            for s in svcs:  # a daemon that ended on its own: what compose would see
                rc = s.exited()
                if rc is not None:
                    if rc != 0:
                        s.bad_exits.append(rc)
                    log(f"{s.name} exited on its own with status {rc}; restarting")
                    if rc == 3:
                        failures.append(f"{s.name} found a corrupt batch (exit 3)")
                    s.start()
            victim = rng.choice([s for s in svcs if s.kills <= mink])
            victim.kill9()
            pause = rng.uniform(0.0, 0.6)
            log(f"SIGKILL {victim.name} (#{victim.kills}); restart in {pause:.2f} s")
            time.sleep(pause)
            victim.start()
            if victim is queue:
                broker_answers(lambda *a: ctl(build, run_dir, *a))
        log("kills: " + ", ".join(f"{s.name} {s.kills}" for s in svcs))

        # let the epoch finish
        def finished():
            st = status(build, run_dir)
            if st and st["batches_total"] > 0 and st["batches_committed"] == st["batches_total"]:
                return st
            return None

        st = wait_until(finished, 120, 0.5)
        last = status(build, run_dir)
        if not st:
            failures.append(f"the epoch did not finish within 120 s after the chaos: {last}")
        else:
            log(f"ledger: {st['batches_committed']} of {st['batches_total']} committed, "
                f"todo {st['batches_todo']}, in flight {st['batches_inflight']}, quarantined "
                f"{st['quarantined']}, acks {st['acks']}, redeliveries {st['redeliveries']}")
            if st["batches_todo"] or st["batches_inflight"] or st["quarantined"]:
                failures.append(f"ledger not clean: {st}")
    except RuntimeError:
        pass
    finally:
        # shutdown in reverse: drafters and target, then the broker. A daemon restarted a
        # moment ago may not have reached main() yet (the loader and OpenBLAS's constructor run
        # first), where SIGTERM's default action kills it whatever the code does; compose would
        # see that too, so give a fresh process until its first log line before judging it.
        for s in reversed(svcs):
            rc = s.proc.poll() if s.proc else None
            if rc not in (None, 0):  # ended on its own, not restarted
                s.bad_exits.append(rc)
                log(f"{s.name} had exited on its own with status {rc}")
            if s.proc and rc is None:
                wait_until(lambda: s.started_logging() or s.proc.poll() is not None, 10)
                s.proc.send_signal(signal.SIGTERM)
                try:
                    rc = s.proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    s.proc.kill()
                    rc = s.proc.wait()
                    failures.append(f"{s.name} did not exit within 15 s of SIGTERM")
                if rc != 0:
                    failures.append(f"{s.name} exited {rc} on SIGTERM")

    # the drafters' own account, independent of the broker: every batch of the epoch was
    # verified by some drafter, and no batch's ack was accepted twice
    consumed, acked = set(), {}
    for s in svcs[2:]:
        for m in re.finditer(r"consumed batch \((\d+), (\d+), (\d+)\)", s.log_text()):
            consumed.add(m.groups())
        for m in re.finditer(r"acked batch \((\d+), (\d+), (\d+)\)", s.log_text()):
            acked[m.groups()] = acked.get(m.groups(), 0) + 1
    total = int(test_vars["DFLASH_BATCHES_PER_BUCKET"]) * len(test_vars["DFLASH_BUCKETS"].split(","))
    twice = [k for k, n in acked.items() if n > 1]
    log(f"drafters: {len(consumed)} distinct batches verified, {len(acked)} acks seen, "
        f"{len(twice)} acked twice (epoch has {total})")
    if len(consumed) != total:
        failures.append(f"{total - len(consumed)} batches of the epoch were never verified")
    if twice:
        failures.append(f"batches acked twice: {twice[:5]}")

    for s in svcs:
        if s.bad_exits:
            failures.append(f"{s.name} exited on its own with status {s.bad_exits} "
                            f"(see {s.log_path})")
        text = s.log_text()
        if "VERIFY FAILED" in text:
            failures.append(f"{s.name}: a batch failed verification (see {s.log_path})")
        if "already trained" in text:
            failures.append(f"{s.name}: a batch was acked twice (see {s.log_path})")
    left = [e for e in os.listdir("/dev/shm") if e.startswith(f"dflash.{pool_name}.")]
    if left:
        failures.append(f"shared memory left behind: {left}")
    if min(s.kills for s in svcs) < a.min_kills:
        failures.append("not enough kills: " + ", ".join(f"{s.name} {s.kills}" for s in svcs))

    for f in failures:
        log(f"FAIL: {f}")
    if failures or a.keep:
        log(f"logs kept in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    log("PASS" if not failures else "FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
