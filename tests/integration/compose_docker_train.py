#!/usr/bin/env python3
"""compose_docker_train: deploy/'s training files under a real Docker daemon, on the cpu backend.

compose_group.py runs the group overlay's command lines as local processes; compose_docker.py runs
docker-compose.yml (the synthetic check) in containers. This runs the training files themselves
in containers of the image deploy/Dockerfile builds: docker-compose.train.yml's bind mounts of the
host's models and data read by the image's unprivileged user (uid 10001), its named checkpoint
volume, compose's `restart: on-failure` after a SIGKILL, and for docker-compose.group.yml the
launcher (dflash-drafter-group) with its two ranks in one container.

The target is compose_group.py's tiny random Qwen3 (8 layers), made on the host with the build's
dflash-mkmodel, and its shard of 48 sequences (dflash-data), in DFLASH_MODELS_DIR and
DFLASH_DATA_DIR (made readable by uid 10001); the compose variables are compose_group.py's (host
backend, small slots) with a checkpoint every 10 steps, the last 1000 kept, a constant learning
rate, and the GPU reservations removed (the cpu backend needs none).

  1. docker-compose.yml + docker-compose.train.yml, one solo drafter: it trains (progress lines
     "step N loss L" in its log, checkpoints step-N written into the dflash-checkpoints volume,
     read from a throwaway container); its dflash-drafter is SIGKILLed from the host; the restart
     policy starts the container again and the drafter resumes exactly from the newest
     checkpoint the volume held when the container started again (by the volume's mtimes; at
     a step > 0; its log names it) and trains past it;
     metrics.jsonl in the dflash-metrics volume (both runs, a line a step) goes past that step
     and the mean loss of its last 10 steps is 10% below its first 10's; `stop` ends every
     container (the namespaces holder too) with exit 0, and the stopped run's summary goes from
     the step resumed at to the newest checkpoint in the volume (the final one).
  2. the same + docker-compose.group.yml with DFLASH_DRAFTER_GPUS=0,0: the launcher's two
     dflash-drafter processes become ranks 0 and 1 of one group in sync and write checkpoints
     into the volume's rank-0/rank-1 directories (none elsewhere); rank-1's process SIGKILLed
     from the host: the launcher says it stops the other, the container is restarted by
     `restart: on-failure`, and the group resumes exactly from the newest checkpoint of either
     directory (as in 1), comes back in sync and checkpoints past it; `stop`: exit 0 of every
     container, both ranks end in one final state, the newest checkpoint in the volume.
Before both, the image's dflash-data (deploy/README.md's recipe for a host without a build)
makes the same shard, byte for byte, as the build's.
Waits are for log lines and container states, with deadlines; one that sees the drafter's
container restart unexpectedly (a refused configuration, exit 2) fails at once.

Usage: compose_docker_train.py BUILD_DIR [--image dflash:cpu-test] [--base-image IMAGE
       [--libuv-package P]] [--only solo|group] [--set VAR=VALUE]... [--keep]
BUILD_DIR has dflash-mkmodel and dflash-data (the target and the shard are made on the host).
--set gives a compose variable over the test's (--set DFLASH_TARGET_MODEL=/models/none fails).
--base-image (default $DFLASH_TEST_BASE_IMAGE) rebuilds the image from this tree first
(docker_lib.py). Exit 0 pass, 1 fail, 77 skipped (no Docker daemon, no compose, or no image and
no base to build it from).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import docker_lib as dl  # noqa: E402
from compose_group import FILES, compose_vars, in_sync, tiny_model  # noqa: E402
from compose_rules import resolve  # noqa: E402
from e2e_common import Build, Env, log, wait_until  # noqa: E402

CKPT = "/var/lib/dflash/checkpoints"  # docker-compose.train.yml's DFLASH_CHECKPOINT_DIR
LOSS = r"\bstep (\d+)(?:/\d+)? loss (\S+) acc "  # the drafter's progress line


def written(text, rank_dirs=False):
    """[(step, path under the volume)] of the drafter's "checkpoint ... written" lines in text:
    step-N at the volume's top, or (rank_dirs) in the rank-K directory of the rank-K process."""
    if rank_dirs:
        found = re.findall(rf"^\[rank-(\d+)\] .*checkpoint {CKPT}/(rank-\1/step-0*(\d+)) "
                           r"written", text, re.M)
        return [(int(s), p) for _, p, s in found]
    return [(int(s), p) for p, s in re.findall(rf"checkpoint {CKPT}/(step-0*(\d+)) written", text)]


def mean_loss(curve):
    return sum(v for _, v in curve) / len(curve) if curve else float("nan")


def say(msg):
    log("compose_docker_train", msg)


def paths(ckpts, n=4):
    """The last n paths of checkpoints()'s list, for messages."""
    return ("... " if len(ckpts) > n else "") + " ".join(p for _, p, _ in ckpts[-n:])


def readable(top):
    """Everything under top readable by any uid, top included: the daemons run as the image's
    uid 10001 (a bind mount's source must be readable by it, not the directories above it)."""
    for d, _, files in os.walk(top):
        os.chmod(d, 0o755)
        for f in files:
            os.chmod(os.path.join(d, f), 0o644)


class Deployment:
    """One compose project of the training files, written for the cpu backend, and the views of
    its drafter container: its log per run, the checkpoint volume, its exit."""

    def __init__(self, compose, name, files, compose_env, tmp, image):
        path = os.path.join(tmp, f"{name}.yml")
        dl.cpu_compose(resolve(files, compose_env), path, say)
        self.p = dl.Project(compose, name, path)
        self.image = image

    def drafter(self):
        cid = self.p.container("drafter")
        if not cid:
            raise RuntimeError("no drafter container")
        return cid

    def run_text(self, cid, since=None, until=None):
        """The drafter's log lines (joined) from since (a State.StartedAt) to before until."""
        lo = dl.timestamp(since) if since else (0, 0)
        hi = dl.timestamp(until) if until else (1 << 62, 0)
        return "\n".join(ln for ts, ln in dl.lines(cid) if lo <= ts < hi) + "\n"

    def checkpoints(self):
        """([(step, path under the volume, mtime)] of the dflash-checkpoints volume by step, the
        volume's listing), read from a throwaway container."""
        vol = self.p.volume("dflash-checkpoints")
        if not vol:
            raise RuntimeError("no dflash-checkpoints volume in the project")
        listing = dl.ls(self.image, vol)
        out = []
        for mtime, path in listing:
            m = re.fullmatch(r"/c/((?:rank-\d+/)?step-0*(\d+))", path)
            if m:
                out.append((int(m.group(2)), m.group(1), mtime))
        return sorted(out), sorted(p for _, p in listing)

    def losses(self):
        """[(step, loss)] of every line of metrics.jsonl in the dflash-metrics volume."""
        vol = self.p.volume("dflash-metrics")
        r = dl.in_volume(self.image, vol, "cat", "/c/metrics.jsonl") if vol else None
        if not r or r.returncode != 0:
            raise RuntimeError(f"cannot read metrics.jsonl in the metrics volume {vol!r}: "
                               f"{r.stderr.strip() if r else 'no such volume'}")
        rows = [json.loads(ln) for ln in r.stdout.splitlines() if ln.strip()]
        return [(r["step"], r["loss"]) for r in rows if "loss" in r]

    def wait(self, cid, since, cond, what, deadline_s=120):
        """What cond (a function of the drafter's log text since since, or a regex searched in
        it) returns first, within deadline_s and before the container restarts; else
        RuntimeError with the log's tail and the container's state."""
        if isinstance(cond, str):
            pattern = cond
            cond = lambda text: re.search(pattern, text, re.M)  # noqa: E731
        restarts = dl.inspect(cid, "{{.RestartCount}}")

        def seen():
            """(True, cond's value) once it holds, (False, None) once the container restarted."""
            if dl.inspect(cid, "{{.RestartCount}}") != restarts:
                return False, None
            v = cond(self.run_text(cid, since))
            return (True, v) if v else None

        r = wait_until(seen, deadline_s, 1.0)
        if not r or not r[0]:
            state = dl.inspect(cid, "{{.State.Status}} exit {{.State.ExitCode}} restarts "
                                    "{{.RestartCount}}")
            tail = "\n".join(self.run_text(cid).splitlines()[-30:])
            when = "before the container restarted" if r else f"within {deadline_s} s"
            raise RuntimeError(f"{what}: not seen in the drafter's log {when} (container "
                               f"{state}):\n{tail}")
        return r[1]

    def sigkill(self, cid, pick, what):
        """SIGKILLs pick's processes in cid from the host; waits for the restart policy to start
        the container again; returns (StartedAt before, StartedAt of the new run)."""
        before = int(dl.inspect(cid, "{{.RestartCount}}"))
        started = dl.inspect(cid, "{{.State.StartedAt}}")
        victims = dl.crash(cid, pick)
        if len(victims) != 1:
            raise RuntimeError(f"{what}: SIGKILLed {victims}, want one process: "
                               f"{dl.processes(cid)}")
        back = wait_until(lambda: int(dl.inspect(cid, "{{.RestartCount}}")) > before and
                          dl.inspect(cid, "{{.State.Running}}") == "true", 60, 0.5)
        if not back:
            raise RuntimeError(f"{what}: the container was not restarted within 60 s: "
                               f"{dl.inspect(cid, '{{.State.Status}} {{.State.ExitCode}}')}")
        return started, dl.inspect(cid, "{{.State.StartedAt}}")

    def resumed(self, cid, prev_run, new_run, what, rank_dirs=False):
        """The newest checkpoint the volume held when the container started again (step S > 0;
        the run before wrote checkpoints) and the new run's line saying it resumed exactly from
        it; returns (S, its path in the volume). Taken from the volume, not from the run
        before's "written" lines: a SIGKILL between a checkpoint's rename and its log line (the
        directory's fsync) leaves a newest checkpoint that no line names."""
        if not written(self.run_text(cid, prev_run, new_run), rank_dirs):
            raise RuntimeError(f"{what}: the run before the restart wrote no checkpoint")
        # the new run's checkpoints are newer than its start; a checkpoint's directory has the
        # mtime of its last file, written before the rename that completed it
        restart = dl.timestamp(new_run)[0] + dl.timestamp(new_run)[1] / 1e9
        ckpts, listing = self.checkpoints()
        older = [(st, p) for st, p, mtime in ckpts if mtime < restart]
        if not older:
            raise RuntimeError(f"{what}: no checkpoint in the volume from before the restart: "
                               f"{listing}")
        step, path = max(older)
        if step <= 0:
            raise RuntimeError(f"{what}: the newest checkpoint before the restart is of step "
                               f"{step}")
        self.wait(cid, new_run, rf"resumed exactly from {CKPT}/{re.escape(path)} at step "
                                rf"{step}\b", f"{what}: resume from {path}", 60)
        return step, path

    def stop(self, failures, what):
        """compose stop: every container ends with exit 0."""
        self.p("stop", "-t", "30", timeout=180)
        for svc in ("drafter", "target", "queue", "namespaces"):
            cid = self.p.container(svc)
            code = dl.inspect(cid, "{{.State.ExitCode}}") if cid else "missing"
            if code != "0":
                failures.append(f"{what}: {svc} ended with exit {code} on stop")

    def dump(self):
        for svc in ("queue", "target", "drafter"):
            say(f"---- {svc} (last lines)\n" + "\n".join(self.p.logs(svc).splitlines()[-25:]))


def solo(dep, failures):
    """1. one solo training drafter: trains, resumes after a SIGKILL, stops with exit 0."""
    cid = dep.drafter()
    first = dl.inspect(cid, "{{.State.StartedAt}}")
    # a progress line in the log, and killed past step 100: the run resumed has trained
    dep.wait(cid, first, lambda text: re.search(LOSS, text) and
             any(st >= 100 for st, _ in written(text)), "solo: a loss line and checkpoint 100")
    ckpts, listing = dep.checkpoints()
    if not ckpts or any("/" in p for _, p, _ in ckpts):
        raise RuntimeError(f"solo: want step-N at the top of the checkpoint volume: {listing}")
    say(f"solo: the drafter trains; volume holds {paths(ckpts)}")
    prev, new = dep.sigkill(cid, lambda a: a[0].endswith("dflash-drafter"), "solo")
    step, path = dep.resumed(cid, prev, new, "solo")
    say(f"solo: SIGKILLed, restarted by compose; resumed exactly from {path} (step {step})")
    dep.wait(cid, new, lambda text: any(st > step for st, _ in written(text)),
             f"solo: a checkpoint past step {step}")
    dep.stop(failures, "solo")
    # the loss, step by step, from metrics.jsonl in the metrics volume (both runs): the progress
    # lines come every 10 s, too few to tell a falling loss from noise
    curve = dep.losses()
    first, last = mean_loss(curve[:10]), mean_loss(curve[-10:])
    say(f"solo: {len(curve)} steps in metrics.jsonl, up to step {curve[-1][0] if curve else '-'}: "
        f"mean loss of the first 10 {first:.4f}, of the last 10 {last:.4f}")
    if len(curve) < 20 or curve[-1][0] <= step or not last < 0.9 * first:
        failures.append(f"solo: want metrics.jsonl's steps past step {step} and the mean loss of "
                        f"its last 10 steps 10% below its first 10's: {first} -> {last}")
    summary = re.findall(r"training: \d+ steps in this run \((\d+) \.\. (\d+)\)",
                         dep.run_text(cid, new))
    ckpts, listing = dep.checkpoints()
    if not summary or not ckpts or ckpts[-1][0] != int(summary[-1][1]) or \
            int(summary[-1][0]) != step:
        failures.append(f"solo: the stopped run's summary {summary} (want it to start at {step} "
                        f"and end at the newest checkpoint in the volume): {paths(ckpts)}")
    else:
        say(f"solo: stop: the run trained {summary[-1][0]} .. {summary[-1][1]}, final "
            f"checkpoint {ckpts[-1][1]} in the volume")


def group(dep, failures):
    """2. a group of 2 ranks in one container: trains, restarts after a rank's SIGKILL, stops."""
    cid = dep.drafter()
    first = dl.inspect(cid, "{{.State.StartedAt}}")
    dep.wait(cid, first, lambda text: in_sync(text, 0), "group: ranks 0 and 1 in sync")
    dep.wait(cid, first, lambda text: any(st >= 4 for st, _ in written(text, True)),
             "group: checkpoint step 4 in a rank directory")
    ckpts, listing = dep.checkpoints()
    dirs = [p for p in listing if re.fullmatch(r"/c/rank-\d+", p)]
    if dirs != ["/c/rank-0", "/c/rank-1"] or \
            not all(re.match(r"rank-[01]/", p) for _, p, _ in ckpts):
        failures.append(f"group: want rank-0 and rank-1 directories holding every checkpoint: "
                        f"{listing}")
    say(f"group: ranks 0 and 1 in sync; volume holds {paths(ckpts)}")
    prev, new = dep.sigkill(cid, lambda a: a[0].endswith("dflash-drafter") and
                            f"{CKPT}/rank-1" in a, "group: rank-1")
    said = dep.run_text(cid, prev, new)
    if not re.search(r"^dflash-drafter-group: rank-1 \(GPU 0\) exited with status 137: stopping "
                     r"the others", said, re.M):
        failures.append("group: the launcher did not say it stops the others after rank-1's "
                        "SIGKILL:\n" + "\n".join(said.splitlines()[-15:]))
    step, path = dep.resumed(cid, prev, new, "group", rank_dirs=True)
    dep.wait(cid, new, lambda text: in_sync(text, step),
             f"group: ranks 0 and 1 in sync again at step >= {step}")
    dep.wait(cid, new, lambda text: any(st > step for st, _ in written(text, True)),
             f"group: a checkpoint past step {step}")
    say(f"group: rank-1 SIGKILLed, the launcher stopped rank-0, compose restarted the container; "
        f"resumed exactly from {path} (step {step}), in sync and checkpointing past it")
    dep.stop(failures, "group")
    text = dep.run_text(cid, new)
    finals = {k: (int(s), h) for k, s, h in re.findall(
        r"^\[rank-(\d)\] .*group train: final state at step (\d+) has hash (\w+)", text, re.M)}
    ckpts, listing = dep.checkpoints()
    if sorted(finals) != ["0", "1"] or len(set(finals.values())) != 1 or \
            ckpts[-1][0] != finals["0"][0] or finals["0"][0] <= step:
        failures.append(f"group: on stop both ranks end in one final state past step {step}, the "
                        f"newest checkpoint: {finals}; volume {paths(ckpts)}")
    if not re.search(r"^dflash-drafter-group: every rank exited 0", text, re.M):
        failures.append("group: the launcher did not say every rank exited 0")
    say(f"group: stop: final state {finals.get('0')}; volume {paths(ckpts, 1)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build_dir")
    dl.add_image_args(ap)
    ap.add_argument("--only", choices=("solo", "group"))
    ap.add_argument("--set", action="append", default=[], metavar="VAR=VALUE",
                    help="a compose variable over the test's (e.g. to see a check fail)")
    a = ap.parse_args()
    if any("=" not in kv for kv in a.set):
        ap.error("--set takes VAR=VALUE")
    compose, rc = dl.ready(a, say)
    if not compose:
        return rc
    build, env, failures = Build(a.build_dir), Env("docker-train"), []
    try:
        model = tiny_model(build, env)
        readable(env.path("vol"))
    except (RuntimeError, OSError) as e:
        say(f"FAIL: the tiny target and its shard: {e}")
        env.cleanup(True)
        return 1
    # the image's own dflash-data (deploy/README.md's recipe for a host without a build) makes
    # the shard the build's made, byte for byte
    image_shard = env.path("vol", "data", "image.shard")
    r = dl.run("docker", "run", "--rm", "-u", f"{os.getuid()}:{os.getgid()}", "-v",
               f"{env.path('vol')}:/work", "-v", f"{env.tmp}:/in:ro", a.image, "dflash-data",
               "--in", "/in/train.jsonl", "--out", "/work/data/image.shard", "--model",
               "/work/models/target", "--buckets", "64", "--max-len", "64", timeout=300)
    same = r.returncode == 0 and os.path.exists(image_shard) and \
        open(image_shard, "rb").read() == open(env.path("vol", "data", "train.shard"), "rb").read()
    if not same:
        failures.append(f"the image's dflash-data (exit {r.returncode}) did not make the build's "
                        f"shard:\n{r.stderr[-1500:]}")
    else:
        say("the image's dflash-data makes the build's shard")
    if os.path.exists(image_shard):
        os.unlink(image_shard)
    tmp = tempfile.mkdtemp(prefix="dflash-compose-train-", dir=env.tmp)
    # a checkpoint every 10 steps, the last 1000 kept: the one resumed from is still in the volume
    # when it is listed (a step takes milliseconds here: keeping 4 of every 2nd step, it was
    # gone by then)
    base = dict(compose_vars(model), DFLASH_IMAGE=a.image, DFLASH_SHM_SIZE="256m",
                DFLASH_MODELS_DIR=env.path("vol", "models"),
                DFLASH_DATA_DIR=env.path("vol", "data"),
                DFLASH_CHECKPOINT_EVERY="10", DFLASH_KEEP_LAST="1000",
                # a constant learning rate, from the first step (no schedule: a warmup of 4% of
                # compose_group's 100000 steps would leave the loss flat for the test's steps)
                DFLASH_MAX_STEPS="0", DFLASH_TOTAL_STEPS="0", DFLASH_LR="3e-3")
    solo_env = {k: v for k, v in base.items() if k != "DFLASH_DRAFTER_GPUS"}
    solo_env["DFLASH_ACCUMULATE"] = "4"  # a loss over 4 batches a step: a smoother curve
    for env_vars in (base, solo_env):
        env_vars.update(kv.split("=", 1) for kv in a.set)
    scenarios = [("solo", solo, FILES[:2], solo_env), ("group", group, FILES, base)]
    for name, fn, files, compose_env in scenarios:
        if a.only and a.only != name:
            continue
        project = f"dflash{name}{os.getpid()}"
        n, dep = len(failures), None
        try:
            dep = Deployment(compose, project, files, compose_env, tmp, a.image)
            say(f"{name}: up: project {project}, " + " + ".join(os.path.basename(f) for f in files))
            r = dep.p("up", "-d", timeout=300)
            if r.returncode != 0:
                raise RuntimeError(f"{name}: compose up failed: " + r.stderr[-2000:])
            fn(dep, failures)
        except (RuntimeError, ValueError) as e:  # ValueError: compose refused the files
            failures.append(str(e))
        except subprocess.TimeoutExpired as e:
            failures.append(f"{name}: timed out: {e}")
        finally:
            if dep and len(failures) > n:
                dep.dump()
            if dep and not a.keep:
                dep.p.down()
    for f in failures:
        say("FAIL: " + f)
    env.cleanup(a.keep or bool(failures))
    say("PASS" if not failures else f"{len(failures)} failure(s); files kept in {env.tmp}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
