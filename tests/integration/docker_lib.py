"""docker_lib: what the tests that run deploy/'s compose files under a real Docker daemon share
(compose_docker.py: the synthetic check; compose_docker_train.py: training, solo and a group).

  * ready(args, log): a daemon that answers, a compose command (`docker compose` v2 or
    docker-compose v1), and the image: built from deploy/Dockerfile on --base-image (default
    $DFLASH_TEST_BASE_IMAGE; no CUDA there: the cpu backend only) so that it holds this tree's
    daemons, else an existing one used as it is. Returns (compose argv, 0), or (None, 77) to skip
    (no daemon, no compose, no image and no base) and (None, 1) when the build fails.
    add_image_args(parser) adds the options it reads (--image, --base-image, --libuv-package,
    --keep).
  * cpu_compose(cfg, path, log): a resolved compose config written out for the cpu backend: the
    GPU reservations and build sections removed, and the memlock ulimits too where this daemon
    could not raise them.
  * Project: one compose project (a unique -p name, the written file): up/stop/down through
    __call__, container(service, n), logs(service), status() (dflash-ctl status in the queue's
    container), volume(name) (the Docker name of one of its named volumes).
  * inspect(cid, fmt), processes(cid), crash(cid, pick): the host's view of a container: its
    state, its process tree, and a SIGKILL from the host to the daemons inside it (a crash, which
    the restart policy answers; `docker kill` is an operator's stop, which it does not).
  * lines(cid): its log as (timestamp, line), stdout and stderr together, so that a run of a
    restarted container (inspect's {{.State.StartedAt}}) can be told from the one before.
  * in_volume(image, volume, *argv), ls(image, volume): a command over a named volume, and what
    the volume holds (paths and their mtimes), from a throwaway container.
"""
import argparse
import calendar
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(*argv, timeout=600, check=False):
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                          check=check)


def compose_command():
    """['docker', 'compose'] (v2) or ['docker-compose'] (v1), or None."""
    if run("docker", "compose", "version").returncode == 0:
        return ["docker", "compose"]
    return ["docker-compose"] if shutil.which("docker-compose") else None


def add_image_args(ap: argparse.ArgumentParser):
    ap.add_argument("--image", default="dflash:cpu-test")
    ap.add_argument("--base-image", default=os.environ.get("DFLASH_TEST_BASE_IMAGE", ""))
    ap.add_argument("--libuv-package", default="libuv1")
    ap.add_argument("--keep", action="store_true", help="leave the containers and volumes")


def ready(a, log):
    """(compose argv, 0) when the daemon, compose and the image a.image are there (built first
    from this tree on a.base_image when given); (None, 77) skipped, (None, 1) a failed build."""
    if not shutil.which("docker") or run("docker", "info").returncode != 0:
        log("no Docker daemon answers (docker info): skipped")
        return None, 77
    compose = compose_command()
    if not compose:
        log("neither `docker compose` nor docker-compose is installed: skipped")
        return None, 77
    if a.base_image:
        log(f"building {a.image} from deploy/Dockerfile on {a.base_image}")
        r = run("docker", "build", "-f", os.path.join(ROOT, "deploy", "Dockerfile"),
                "--build-arg", f"BUILD_IMAGE={a.base_image}",
                "--build-arg", f"RUNTIME_IMAGE={a.base_image}",
                "--build-arg", f"LIBUV_PACKAGE={a.libuv_package}", "-t", a.image, ROOT,
                timeout=1800)
        if r.returncode != 0:
            log("the image build failed:\n" + r.stdout[-3000:] + r.stderr[-3000:])
            return None, 1
    elif run("docker", "image", "inspect", a.image).returncode != 0:
        log(f"no image {a.image} and no --base-image to build it from: skipped")
        return None, 77
    else:
        log(f"the existing image {a.image}, not rebuilt from this tree (--base-image or "
            "DFLASH_TEST_BASE_IMAGE rebuilds it)")
    return compose, 0


def cpu_compose(cfg, path, log):
    """Writes the resolved config cfg to path for the cpu backend (no GPU reservations, no build
    sections; no ulimits where memlock's hard limit is finite)."""
    import yaml
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
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)


class Project:
    """One compose project: compose argv, its -p name and the file cpu_compose wrote."""

    def __init__(self, compose, name, path):
        self.name = name
        self.dc = compose + ["-p", name, "-f", path]

    def __call__(self, *args, timeout=600):
        return run(*self.dc, *args, timeout=timeout)

    def container(self, service, index=1):
        """The id of service's index-th container (by name), or None."""
        ids = self("ps", "-q", service).stdout.split()
        names = sorted((inspect(i, "{{.Name}}"), i) for i in ids)
        return names[index - 1][1] if len(names) >= index else None

    def logs(self, service):
        return self("logs", "--no-color", service).stdout

    def status(self):
        """dflash-ctl status --json in the queue's container, or None."""
        r = self("exec", "-T", "queue", "dflash-ctl", "--timeout-ms", "1000", "status", "--json",
                 timeout=30)
        try:
            return json.loads(r.stdout) if r.returncode == 0 else None
        except json.JSONDecodeError:
            return None

    def volume(self, name):
        """The Docker name of this project's named volume name (compose labels it)."""
        r = run("docker", "volume", "ls", "-q", "--filter",
                f"label=com.docker.compose.project={self.name}", "--filter",
                f"label=com.docker.compose.volume={name}")
        vols = r.stdout.split()
        return vols[0] if len(vols) == 1 else None

    def down(self):
        return self("down", "-v", "-t", "5", timeout=180)


def inspect(cid, fmt):
    return run("docker", "inspect", "-f", fmt, cid).stdout.strip()


def processes(cid):
    """{host pid: argv} of the processes of container cid: its first process (the daemon, or an
    init above it) and every descendant."""
    out, todo = {}, [int(inspect(cid, "{{.State.Pid}}"))]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                out[pid] = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    todo += [int(p) for p in f.read().split()]
        except (OSError, ValueError):
            continue  # gone meanwhile
    return out


def crash(cid, pick=lambda argv: argv[0].startswith("dflash-")):
    """SIGKILLs the processes of container cid whose argv pick chooses (the daemons by default)
    from the host, as a crash or the OOM killer would (`docker kill` counts as an operator's stop,
    which no restart policy undoes). Returns their pids."""
    victims = [pid for pid, argv in processes(cid).items() if argv and pick(argv)]
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    return victims


def timestamp(text):
    """A Docker RFC 3339 timestamp in UTC (nanoseconds, trailing zeros trimmed), e.g. inspect's
    {{.State.StartedAt}}, as a comparable tuple (seconds since the epoch, nanoseconds)."""
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?Z", text)
    if not m:
        raise ValueError(f"not a Docker timestamp: {text!r}")
    secs = calendar.timegm(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S"))
    return secs, int((m.group(2) or "0").ljust(9, "0")[:9])


def lines(cid):
    """[(timestamp tuple, line)] of container cid's log (every run of it), stdout and stderr
    together, in order."""
    r = subprocess.run(["docker", "logs", "-t", cid], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, errors="replace", timeout=60)
    out = []
    for ln in r.stdout.splitlines():
        ts, _, rest = ln.partition(" ")
        try:
            out.append((timestamp(ts), rest))
        except ValueError:
            out.append((out[-1][0] if out else (0, 0), ln))
    return out


def in_volume(image, volume, *argv):
    """argv run in a throwaway container of image with the named volume mounted read-only at /c:
    the CompletedProcess (stdout, stderr, returncode)."""
    return run("docker", "run", "--rm", "-v", f"{volume}:/c:ro", image, *argv, timeout=60)


def ls(image, volume):
    """[(mtime in seconds since the epoch, path)] of what the named volume holds, mounted at /c,
    two levels deep. A writer may rename an entry while find walks it (a checkpoint's temporary
    directory): find then says "No such file or directory" for it and exits 1, and the rest of
    its listing stands. RuntimeError for any other failure, with find's or docker's words."""
    r = in_volume(image, volume, "find", "/c", "-mindepth", "1", "-maxdepth", "2", "-printf",
                  "%T@ %p\\n")
    vanished = all("No such file or directory" in ln for ln in r.stderr.splitlines())
    if r.returncode != 0 and not (r.returncode == 1 and r.stderr and vanished):
        raise RuntimeError(f"cannot list the volume {volume!r} (exit {r.returncode}): "
                           f"{r.stderr.strip()[-500:]}")
    return [(float(t), p) for t, p in (ln.split(" ", 1) for ln in r.stdout.splitlines())]
