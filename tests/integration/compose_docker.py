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
  * the broker's healthcheck is healthy, and `stop` ends every container with exit 0.

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
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chaos_compose as cc  # noqa: E402  (TEST_VARS, resolve_compose, wait_until, log)


def run(*argv, timeout=600, check=False):
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                          check=check)


def compose_command():
    """['docker', 'compose'] (v2) or ['docker-compose'] (v1), or None."""
    if run("docker", "compose", "version").returncode == 0:
        return ["docker", "compose"]
    return ["docker-compose"] if shutil.which("docker-compose") else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", default="dflash:cpu-test")
    ap.add_argument("--base-image", default=os.environ.get("DFLASH_TEST_BASE_IMAGE", ""))
    ap.add_argument("--libuv-package", default="libuv1")
    ap.add_argument("--batches-per-bucket", type=int, default=150)
    ap.add_argument("--keep", action="store_true", help="leave the containers and volumes")
    a = ap.parse_args()
    log = cc.log
    if not shutil.which("docker") or run("docker", "info").returncode != 0:
        log("no Docker daemon answers (docker info): skipped")
        return 77
    compose = compose_command()
    if not compose:
        log("neither `docker compose` nor docker-compose is installed: skipped")
        return 77
    if a.base_image:
        log(f"building {a.image} from deploy/Dockerfile on {a.base_image}")
        r = run("docker", "build", "-f", os.path.join(cc.ROOT, "deploy", "Dockerfile"),
                "--build-arg", f"BUILD_IMAGE={a.base_image}",
                "--build-arg", f"RUNTIME_IMAGE={a.base_image}",
                "--build-arg", f"LIBUV_PACKAGE={a.libuv_package}", "-t", a.image, cc.ROOT,
                timeout=1800)
        if r.returncode != 0:
            log("the image build failed:\n" + r.stdout[-3000:] + r.stderr[-3000:])
            return 1
    elif run("docker", "image", "inspect", a.image).returncode != 0:
        log(f"no image {a.image} and no --base-image to build it from: skipped")
        return 77
    else:
        log(f"the existing image {a.image}, not rebuilt from this tree (--base-image or "
            "DFLASH_TEST_BASE_IMAGE rebuilds it)")

    test_vars = dict(cc.TEST_VARS, DFLASH_IMAGE=a.image, DFLASH_SHM_SIZE="256m",
                     DFLASH_BATCHES_PER_BUCKET=str(a.batches_per_bucket))
    cfg = cc.resolve_compose(test_vars)
    # memlock unlimited (for CUDA's pinned memory) needs a daemon that may raise the limit; a
    # sandboxed one without CAP_SYS_RESOURCE cannot, and the cpu backend does not need it
    keep_ulimits = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1] == resource.RLIM_INFINITY
    if not keep_ulimits:
        log("memlock's hard limit is finite here: the services' ulimits are left out")
    for svc in cfg["services"].values():
        svc.pop("deploy", None)  # GPU reservations: the cpu backend needs no GPU
        svc.pop("build", None)
        if not keep_ulimits:
            svc.pop("ulimits", None)
    tmp = tempfile.mkdtemp(prefix="dflash-compose-")
    path = os.path.join(tmp, "compose.yml")
    import yaml
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    project = f"dflashtest{os.getpid()}"
    dc = compose + ["-p", project, "-f", path]
    failures = []

    def container(service, index=1):
        ids = run(*dc, "ps", "-q", service).stdout.split()
        names = sorted((run("docker", "inspect", "-f", "{{.Name}}", i).stdout.strip(), i)
                       for i in ids)
        return names[index - 1][1] if len(names) >= index else None

    def inspect(cid, fmt):
        return run("docker", "inspect", "-f", fmt, cid).stdout.strip()

    def crash(cid):
        """SIGKILL the daemon inside container cid from the host, as a crash or the OOM killer
        would (`docker kill` counts as an operator's stop, which no restart policy undoes)."""
        top = int(inspect(cid, "{{.State.Pid}}"))  # the daemon, or an init above it
        with open(f"/proc/{top}/task/{top}/children") as f:
            for pid in [top] + [int(p) for p in f.read().split()]:
                with open(f"/proc/{pid}/cmdline", "rb") as c:
                    if c.read().startswith(b"dflash-"):
                        os.kill(pid, signal.SIGKILL)

    def status():
        r = run(*dc, "exec", "-T", "queue", "dflash-ctl", "--timeout-ms", "1000", "status",
                "--json", timeout=30)
        try:
            return json.loads(r.stdout) if r.returncode == 0 else None
        except json.JSONDecodeError:
            return None

    def logs(service):
        return run(*dc, "logs", "--no-color", service).stdout

    try:
        log(f"up: project {project}, 2 drafters")
        r = run(*dc, "up", "-d", "--scale", "drafter=2", timeout=300)
        if r.returncode != 0:
            failures.append("compose up failed: " + r.stderr[-2000:])
            raise RuntimeError
        total = a.batches_per_bucket * len(test_vars["DFLASH_BUCKETS"].split(","))
        st = cc.wait_until(lambda: (s := status()) and s["batches_committed"] >= total // 5
                           and s, 120, 0.5)
        if not st:
            failures.append(f"a fifth of the epoch was not committed within 120 s: {status()}")
            raise RuntimeError
        log(f"{st['batches_committed']} of {total} committed; SIGKILL target and drafter 1")
        victims = {"target": container("target"), "drafter": container("drafter", 1)}
        before = {k: int(inspect(c, "{{.RestartCount}}")) for k, c in victims.items()}
        for c in victims.values():  # the daemon under the container's init, as a crash
            crash(c)
        for k, c in victims.items():
            back = cc.wait_until(lambda: int(inspect(c, "{{.RestartCount}}")) > before[k]
                                 and inspect(c, "{{.State.Running}}") == "true", 60, 0.5)
            if not back:
                failures.append(f"{k}'s container was not restarted after SIGKILL")
        log("both restarted by compose's policy")

        def finished():
            s = status()
            return s if s and s["batches_total"] > 0 and \
                s["batches_committed"] == s["batches_total"] else None

        st = cc.wait_until(finished, 240, 1.0)
        if not st:
            failures.append(f"the epoch did not finish within 240 s: {status()}")
        else:
            log(f"ledger: {st['batches_committed']} of {st['batches_total']} committed, todo "
                f"{st['batches_todo']}, in flight {st['batches_inflight']}, quarantined "
                f"{st['quarantined']}, redeliveries {st['redeliveries']}")
            if st["batches_total"] != total:
                failures.append(f"the epoch has {st['batches_total']} batches, not {total}")
            if st["batches_todo"] or st["batches_inflight"] or st["quarantined"]:
                failures.append(f"ledger not clean: {st}")
        dlog, tlog = logs("drafter"), logs("target")
        if "VERIFY FAILED" in dlog or "exits 3" in dlog:
            failures.append("a drafter reported a failed verification")
        names = set(re.findall(r"effective configuration \(name ([^,]+),", dlog))
        hostname = inspect(victims["target"], "{{.Config.Hostname}}")
        log(f"drafter names {sorted(names)}; target host {hostname}")
        if len(names) < 3 or not all(n.startswith("drafter-") for n in names):
            failures.append(f"want 3 drafter-<host>-<pid> names (2 + 1 restart): {names}")
        if f"name target-{hostname}" not in tlog:
            failures.append(f"the target did not name itself target-{hostname}")
        health = inspect(container("queue"), "{{.State.Health.Status}}")
        if health != "healthy":
            failures.append(f"the broker's healthcheck is {health!r}")
        run(*dc, "stop", "-t", "30", timeout=180)
        for svc, n in (("queue", 1), ("target", 1), ("drafter", 1), ("drafter", 2)):
            cid = container(svc, n)
            code = inspect(cid, "{{.State.ExitCode}}") if cid else "missing"
            if code != "0":
                failures.append(f"{svc} {n} ended with exit {code}")
        if failures:
            for svc in ("queue", "target", "drafter"):
                print(f"---- {svc} (last lines)\n" + "\n".join(logs(svc).splitlines()[-25:]))
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        if isinstance(e, subprocess.TimeoutExpired):
            failures.append(f"timed out: {e}")
    finally:
        if not a.keep:
            run(*dc, "down", "-v", "-t", "5", timeout=180)
            shutil.rmtree(tmp, ignore_errors=True)
    for f in failures:
        log("FAIL: " + f)
    log("PASS" if not failures else f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
