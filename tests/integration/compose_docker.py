#!/usr/bin/env python3
"""compose_docker: deploy/docker-compose.yml under a real Docker daemon, on the cpu backend.

chaos_compose.py runs the compose file's command lines and environments as local processes;
this runs the file itself: real containers from the image deploy/Dockerfile builds, the
`namespaces` holder's IPC and PID namespaces joined by target and drafters (the host pool's
POSIX shared memory crosses containers through them), the 0700 runtime volume as the image's
unprivileged user, the healthchecks that `depends_on` waits for, `--scale drafter=2` with the
names the daemons pick for themselves, and compose's restart policies after a SIGKILL.

With the test settings of chaos_compose.py (host backend, small slots, a paced synthetic target,
verifying drafters; the GPU reservations removed, since the cpu backend needs none) it starts
the deployment, waits until part of the epoch is trained, SIGKILLs the daemon in the target's
container and in one drafter's (from the host, as a crash), and checks:
  * both containers are restarted by their policy and register again,
  * the epoch completes: every batch committed, none to do, in flight or quarantined, and no
    drafter reports a failed verification,
  * two drafters with distinct names and the target as target-<container hostname>,
  * the broker's healthcheck is healthy; the target's and each drafter's (dflash-ctl peer
    @target / @drafter) pass in their own containers while the epoch trains (a restarted one
    once it registered again), and the target's fails in the broker's container;
  * the namespace holder stopped alone (`docker stop`, as a host shutdown or `compose restart`
    stops it beside the others) passes the stop on: target and drafters exit 0, not 137;
  * `stop` ends every container with exit 0.

Usage: compose_docker.py [--image dflash:cpu-test] [--base-image IMAGE [--libuv-package P]]
       [--batches-per-bucket N] [--keep]
--base-image (default: $DFLASH_TEST_BASE_IMAGE) builds the image first from deploy/Dockerfile on
that Debian/Ubuntu image (no CUDA: the cpu backend only), so that it holds this tree's daemons;
without it an existing image is used as it is. Exit 0 pass, 1 fail, 77 skipped
(no Docker daemon, no compose, or no image and no base to build it from).
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chaos_compose as cc  # noqa: E402  (TEST_VARS, resolve_compose, wait_until, log)
import docker_lib as dl  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    dl.add_image_args(ap)
    ap.add_argument("--batches-per-bucket", type=int, default=250)
    a = ap.parse_args()
    log = cc.log
    compose, rc = dl.ready(a, log)
    if not compose:
        return rc

    test_vars = dict(cc.TEST_VARS, DFLASH_IMAGE=a.image, DFLASH_SHM_SIZE="256m",
                     DFLASH_BATCHES_PER_BUCKET=str(a.batches_per_bucket))
    tmp = tempfile.mkdtemp(prefix="dflash-compose-")
    path = os.path.join(tmp, "compose.yml")
    dl.cpu_compose(cc.resolve_compose(test_vars), path, log)
    project = f"dflashtest{os.getpid()}"
    p = dl.Project(compose, project, path)
    failures = []

    try:
        log(f"up: project {project}, 2 drafters")
        r = p("up", "-d", "--scale", "drafter=2", timeout=300)
        if r.returncode != 0:
            failures.append("compose up failed: " + r.stderr[-2000:])
            raise RuntimeError
        total = a.batches_per_bucket * len(test_vars["DFLASH_BUCKETS"].split(","))
        st = cc.wait_until(lambda: (s := p.status()) and s["batches_committed"] >= total // 5
                           and s, 120, 0.5)
        if not st:
            failures.append(f"a fifth of the epoch was not committed within 120 s: {p.status()}")
            raise RuntimeError
        log(f"{st['batches_committed']} of {total} committed; SIGKILL target and drafter 1")
        victims = {"target": p.container("target"), "drafter": p.container("drafter", 1)}
        before = {k: int(dl.inspect(c, "{{.RestartCount}}")) for k, c in victims.items()}
        for c in victims.values():  # the daemon under the container's init, as a crash
            dl.crash(c)
        for k, c in victims.items():
            back = cc.wait_until(lambda: int(dl.inspect(c, "{{.RestartCount}}")) > before[k]
                                 and dl.inspect(c, "{{.State.Running}}") == "true", 60, 0.5)
            if not back:
                failures.append(f"{k}'s container was not restarted after SIGKILL")
        log("both restarted by compose's policy")
        # each service's own healthcheck command, run in its containers while the epoch trains:
        # the target's and the drafters' pass once the broker lists their own daemon (a restarted
        # one once it registered again); the target's in the broker's container names a target
        # that is not there (another hostname) and fails: it asks for its own daemon, not only
        # whether the broker answers
        def health_test(cid):
            test = json.loads(dl.inspect(cid, "{{json .Config.Healthcheck.Test}}") or "null")
            return test[1:] if test and test[0] == "CMD" else None

        checks = [("target", 1, 0), ("drafter", 1, 0), ("drafter", 2, 0)]
        for svc, n, want in checks:
            cid = p.container(svc, n)
            argv = health_test(cid) if cid else None
            if not argv or "peer" not in argv:
                failures.append(f"{svc} {n}'s healthcheck is not dflash-ctl peer: {argv}")
                continue
            ok = cc.wait_until(lambda: dl.run("docker", "exec", cid, *argv,
                                              timeout=30).returncode == 0, 30, 1.0)
            if not ok:
                r = dl.run("docker", "exec", cid, *argv, timeout=30)
                failures.append(f"{svc} {n}'s healthcheck {argv} failed: exit {r.returncode}: "
                                f"{r.stderr.strip()[-300:]}")
        target_test = health_test(p.container("target"))
        if target_test:
            r = dl.run("docker", "exec", p.container("queue"), *target_test, timeout=30)
            if r.returncode != 1:
                failures.append(f"the target's healthcheck in the broker's container exited "
                                f"{r.returncode}, not 1 (no target of that host)")
        log("the target's and the drafters' healthchecks pass in their own containers, the "
            "target's fails in the broker's")

        def finished():
            s = p.status()
            return s if s and s["batches_total"] > 0 and \
                s["batches_committed"] == s["batches_total"] else None

        st = cc.wait_until(finished, 240, 1.0)
        if not st:
            failures.append(f"the epoch did not finish within 240 s: {p.status()}")
        else:
            log(f"ledger: {st['batches_committed']} of {st['batches_total']} committed, todo "
                f"{st['batches_todo']}, in flight {st['batches_inflight']}, quarantined "
                f"{st['quarantined']}, redeliveries {st['redeliveries']}")
            if st["batches_total"] != total:
                failures.append(f"the epoch has {st['batches_total']} batches, not {total}")
            if st["batches_todo"] or st["batches_inflight"] or st["quarantined"]:
                failures.append(f"ledger not clean: {st}")
        dlog, tlog = p.logs("drafter"), p.logs("target")
        if "VERIFY FAILED" in dlog or "exits 3" in dlog:
            failures.append("a drafter reported a failed verification")
        names = set(re.findall(r"effective configuration \(name ([^,]+),", dlog))
        hostname = dl.inspect(victims["target"], "{{.Config.Hostname}}")
        log(f"drafter names {sorted(names)}; target host {hostname}")
        if len(names) < 3 or not all(n.startswith("drafter-") for n in names):
            failures.append(f"want 3 drafter-<host>-<pid> names (2 + 1 restart): {names}")
        if f"name target-{hostname}" not in tlog:
            failures.append(f"the target did not name itself target-{hostname}")
        health = dl.inspect(p.container("queue"), "{{.State.Health.Status}}")
        if health != "healthy":
            failures.append(f"the broker's healthcheck is {health!r}")
        # the namespace holder stopped first, as a host shutdown or `compose restart` may (docker
        # stops them all at once): its exit SIGKILLs every process of its PID namespace, so it
        # passes the stop on and waits; target and drafters end as their own stop ends them
        # (exit 0; 137 was the holder's SIGKILL)
        dl.run("docker", "stop", "-t", "60", p.container("namespaces"), timeout=120)
        for svc, n in (("target", 1), ("drafter", 1), ("drafter", 2)):
            cid = p.container(svc, n)  # its exit, waited for (a running one reads ExitCode 0)
            code = dl.run("docker", "wait", cid, timeout=60).stdout.strip() if cid else "missing"
            if code != "0":
                failures.append(f"{svc} {n} ended with exit {code} when the namespace holder "
                                f"alone was stopped (137: SIGKILLed with it)")
        p("stop", "-t", "30", timeout=180)
        for svc, n in (("queue", 1), ("target", 1), ("drafter", 1), ("drafter", 2),
                       ("namespaces", 1)):
            cid = p.container(svc, n)
            code = dl.inspect(cid, "{{.State.ExitCode}}") if cid else "missing"
            if code != "0":
                failures.append(f"{svc} {n} ended with exit {code}")
        if failures:
            for svc in ("queue", "target", "drafter"):
                print(f"---- {svc} (last lines)\n" + "\n".join(p.logs(svc).splitlines()[-25:]))
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        if isinstance(e, subprocess.TimeoutExpired):
            failures.append(f"timed out: {e}")
    finally:
        if not a.keep:
            p.down()
            shutil.rmtree(tmp, ignore_errors=True)
    for f in failures:
        log("FAIL: " + f)
    log("PASS" if not failures else f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
