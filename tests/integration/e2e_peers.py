#!/usr/bin/env python3
"""e2e_peers: what the daemons and dflash-ctl do when a peer is a duplicate or the broker goes.

Cases (one per ctest test, chosen by the second argument):
  duplicate    two dflash-target with the same --name on one broker (two started with the
               default name, or `docker compose --scale target=2` with one DFLASH_NAME) used to
               replace each other about 50 times a second for ever, each logging that the broker
               "restarted or forgot us". Now one of them exits 4 saying the name is in use and
               the other keeps producing; the same for two drafters given one --name. The
               default target name is target-<host> (was target0 everywhere).
  broker_gone  a broker SIGKILLed mid-run: the target's progress line said "waiting for a free
               slot 100%" (the drafter's "waiting for a grant 100%") and nothing else. Now both
               say they wait for the broker, and once a new broker answers they register again.
  watch        `dflash-ctl watch --count N` hung for ever when the broker went away: it now
               says so and exits 2 (no broker answering), as the other verbs do.
  curve_keys   a target or drafter given a CURVE key file it cannot use (mode 0644) exited 1,
               as for a fatal run-time error; it is bad configuration: exit 2, naming the file.
               The same for dflash-queue's secret key file, and for a runtime dir that others
               can enter (mode 0755): the broker exited 1 for both; and for a dflash-target
               --name that cannot name a pool ('a b'), refused when the pool was made (exit 1).
Usage: e2e_peers.py BUILD_DIR CASE [--keep]. Exit 0 pass, 1 fail.
"""
import os
import re
import socket
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_common import (Build, Daemon, Env, log, report, start_broker, tail,  # noqa: E402
                        wait_until)

NAME = "e2e-peers"


def start(env, d):
    env.daemons.append(d)
    d.start()
    return d


def queue(build, env, tag="queue"):
    q = Daemon(tag, [build.queue, "--runtime-dir", env.run, "--journal", "none",
                     "--min-ready", "0", "--stats-interval-ms", "200"], env.tmp)
    env.daemons.append(q)
    start_broker(build, env, q)
    return q


def target(build, env, tag, *extra):
    return start(env, Daemon(tag, [build.target, "--runtime-dir", env.run, "--backend", "host",
                                   "--model", "synthetic", "--rate", "50", "--hidden", "8",
                                   "--layers", "1", "--token-budget", "256", "--buckets",
                                   "64,256", "--slots", "4", *extra], env.tmp))


def case_duplicate(build, env, failures):
    queue(build, env)
    a = target(build, env, "target-a")
    if not wait_until(lambda: "registered pool" in a.text(), 30):
        failures.append(f"the first target did not register:\n{tail(a.log_path)}")
        return
    b = target(build, env, "target-b")  # same default --name
    gone = wait_until(lambda: [d for d in (a, b) if not d.alive()], 30)
    if not gone:
        failures.append("two targets with one --name both kept running (replacing each other):"
                        f"\n{tail(a.log_path, 8)}\n{tail(b.log_path, 8)}")
        return
    loser = gone[0]
    winner = b if loser is a else a
    rc = loser.wait(10)
    if rc != 4:
        failures.append(f"the duplicate target exited {rc}, want 4:\n{tail(loser.log_path)}")
    if "give each target its own --name" not in loser.text():
        failures.append(f"the duplicate target did not say to give another --name:\n"
                        f"{tail(loser.log_path)}")
    # the default name follows the host (one per container under compose), not "target0"
    host = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname().split(".")[0]) or "0"
    want = f"target-{host}"[:31]
    if f"'{want}" not in loser.text():
        failures.append(f"the duplicate target's name is not the default target-<host> "
                        f"({want}):\n{tail(loser.log_path)}")
    if not winner.alive():
        failures.append(f"the remaining target exited:\n{tail(winner.log_path)}")

    # two drafters given one --name: one exits 4, the other serves on
    drafters = [start(env, Daemon(f"drafter-{i}", [
        build.drafter, "--runtime-dir", env.run, "--backend", "host", "--verify", "--name",
        "twin", "--hidden", "8", "--layers", "1", "--token-budget", "256", "--buckets", "64,256"],
        env.tmp)) for i in range(2)]
    gone = wait_until(lambda: [d for d in drafters if not d.alive()], 60)
    if not gone:
        failures.append("two drafters with one --name both kept running")
        return
    rc = gone[0].wait(10)
    # the broker's refusal, relayed: "... is in use by another live process ...: give each
    # drafter its own --name" (the log also holds the argv, so "--name" alone proves nothing)
    if rc != 4 or "give each drafter its own --name" not in gone[0].text():
        failures.append(f"the duplicate drafter exited {rc}, want 4 naming --name:\n"
                        f"{tail(gone[0].log_path)}")
    other = drafters[1] if gone[0] is drafters[0] else drafters[0]
    if not other.alive():
        failures.append(f"both drafters exited:\n{tail(other.log_path)}")


def case_broker_gone(build, env, failures):
    q = queue(build, env)
    t = target(build, env, "target", "--progress-ms", "200", "--batches-per-bucket", "100000")
    d = start(env, Daemon("drafter", [
        build.drafter, "--runtime-dir", env.run, "--backend", "host", "--verify", "--hidden", "8",
        "--layers", "1", "--token-budget", "256", "--buckets", "64,256", "--rate", "20",
        "--progress-ms", "200"], env.tmp))
    registered = {t: "registered pool", d: "registered with broker"}
    for p, line in registered.items():
        if not wait_until(lambda: line in p.text(), 30):
            failures.append(f"{p.name} did not register:\n{tail(p.log_path)}")
            return
    # a progress line with a batch trained ("batches 0 (+0)" and the config's "max-batches"
    # do not count)
    if not wait_until(lambda: re.search(r"batches [1-9][0-9]* \(", d.text()), 30):
        failures.append(f"the drafter got no batch:\n{tail(d.log_path)}")
    q.kill9()
    marks = {p: len(p.text()) for p in registered}
    for p in registered:
        if not wait_until(lambda: "waiting for the broker" in p.text()[marks[p]:], 30):
            failures.append(f"after the broker died {p.name} did not say it waits for it:\n"
                            f"{tail(p.log_path)}")
    for p, blame in ((t, "waiting for a free slot 100%"), (d, "waiting for a grant 100%")):
        if blame in p.text()[marks[p]:]:
            failures.append(f"{p.name} blamed its peers for a missing broker:\n"
                            f"{tail(p.log_path)}")
    queue(build, env, "queue2")
    for p, line in registered.items():
        if not wait_until(lambda: p.text().count(line) >= 2, 30):
            failures.append(f"{p.name} did not register with the new broker:\n"
                            f"{tail(p.log_path)}")
        if not p.alive():
            failures.append(f"{p.name} exited:\n{tail(p.log_path)}")


def case_watch(build, env, failures):
    q = queue(build, env)
    out = env.path("watch.out")
    with open(out, "w") as f:
        w = subprocess.Popen([build.ctl, "--runtime-dir", env.run, "--timeout-ms", "1000",
                              "--count", "1000000", "watch"], stdout=f, stderr=subprocess.STDOUT)
    try:
        if not wait_until(lambda: "stats" in open(out).read(), 30):
            failures.append(f"watch printed no stats line:\n{tail(out)}")
            return
        q.kill9()
        try:
            rc = w.wait(timeout=60)
        except subprocess.TimeoutExpired:
            failures.append(f"watch did not notice that the broker is gone:\n{tail(out)}")
            return
        if rc != 2:
            failures.append(f"watch exited {rc} after the broker went, want 2:\n{tail(out)}")
        if "broker" not in open(out).read().split("stats")[-1]:
            failures.append(f"watch did not say the broker went:\n{tail(out)}")
    finally:
        if w.poll() is None:
            w.kill()
            w.wait()


def case_curve_keys(build, env, failures):
    keys = env.path("keys")
    os.mkdir(keys)
    for name in ("broker", "node"):
        p = subprocess.run([build.ctl, "keygen", keys, name], capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"dflash-ctl keygen {name}: {p.stdout}{p.stderr}")
    node_key = os.path.join(keys, "node.key")
    os.chmod(node_key, 0o644)
    curve = ["--endpoint", "tcp://127.0.0.1:1", "--curve-server-key",
             os.path.join(keys, "broker.pub"), "--curve-key", node_key, "--broker-wait-ms", "2000"]
    for what, argv in (("dflash-target", [build.target, "--backend", "host", "--runtime-dir",
                                          env.run, *curve]),
                       ("dflash-drafter", [build.drafter, "--verify", "--backend", "host",
                                           "--runtime-dir", env.run, *curve])):
        p = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=env.tmp)
        out = p.stdout + p.stderr
        if p.returncode != 2 or "node.key must be ours with mode 0600" not in out:
            failures.append(f"{what} with a 0644 key file: exit {p.returncode}, want 2 naming "
                            f"the file:\n{out[-2000:]}")
        else:
            log(NAME, f"{what} refused the 0644 key file, exit 2")
    broker_key = os.path.join(keys, "broker.key")
    os.chmod(broker_key, 0o644)
    open_dir = env.path("open-run")
    os.mkdir(open_dir, 0o755)
    os.chmod(open_dir, 0o755)
    for what, argv, says in (
            ("dflash-queue with a 0644 secret key", [build.queue, "--runtime-dir", env.run,
             "--journal", "none", "--bind", "tcp://127.0.0.1:0", "--curve-secret-key",
             broker_key, "--curve-clients", keys], "must be ours with mode 0600"),
            ("dflash-queue on a 0755 runtime dir", [build.queue, "--runtime-dir", open_dir,
             "--journal", "none"], "mode 0700"),
            ("dflash-target named 'a b'", [build.target, "--name", "a b", "--backend", "host",
             "--runtime-dir", env.run, "--broker-wait-ms", "100"], "--name 'a b'")):
        p = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=env.tmp)
        out = p.stdout + p.stderr
        if p.returncode != 2 or says not in out:
            failures.append(f"{what}: exit {p.returncode}, want 2 saying {says!r}:\n{out[-2000:]}")
        else:
            log(NAME, f"{what}: refused, exit 2")


def main():
    build = Build(sys.argv[1])
    case = sys.argv[2] if len(sys.argv) > 2 else ""
    cases = {"duplicate": case_duplicate, "broker_gone": case_broker_gone, "watch": case_watch,
             "curve_keys": case_curve_keys}
    if case not in cases:
        print(f"usage: e2e_peers.py BUILD_DIR {'|'.join(cases)} [--keep]", file=sys.stderr)
        return 2
    env = Env(f"peers-{case}")
    failures = []
    try:
        log(NAME, case)
        cases[case](build, env, failures)
    except Exception as e:  # noqa: BLE001 - reported as a failure with the logs kept
        failures.append(f"{type(e).__name__}: {e}")
    finally:
        env.cleanup(keep=bool(failures) or "--keep" in sys.argv)
    return report(env, failures)


if __name__ == "__main__":
    sys.exit(main())
