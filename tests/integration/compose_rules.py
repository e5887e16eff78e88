#!/usr/bin/env python3
"""compose_rules: deploy/docker-compose.yml keeps the promises deploy/README.md makes.

compose_schema checks that the file is valid compose; this checks that what it describes works,
without docker. The file is resolved as an operator would run it (`docker-compose config`, or
PyYAML with ${VAR:-default} interpolation when docker-compose is missing) and each rule below is
checked; then each rule is broken on purpose in a copy, which must be refused (so no rule is a
check that cannot fail).

Namespaces and restarts (a daemon's exit must not kill the others):
  * a service that joins another's PID or IPC namespace (`pid`/`ipc: "service:X"`) joins a
    holder X that runs no daemon; when the PID 1 of a PID namespace exits, the kernel SIGKILLs
    every process in it, so joining the target's namespace meant a drained or restarted target
    killed the drafters mid-step, before their final checkpoint;
  * target and drafters share one PID namespace (CUDA IPC needs the exporter's and importers'
    PIDs distinct and real) and one IPC namespace (the host backend's POSIX shared memory),
    whose holder has `ipc: shareable`, `init: true` and the `shm_size`;
  * target and drafters restart `on-failure` only: a drained target or drafter exits 0 by
    design and must stay down (`unless-stopped`/`always` would start a target that registers,
    is told to shut down and exits again, over and over).

Usage: compose_rules.py SOURCE_DIR   exit 0 pass, 1 fail, 77 skipped (no PyYAML)
"""
import copy
import os
import re
import shutil
import subprocess
import sys

DAEMONS = {"dflash-queue", "dflash-target", "dflash-drafter"}


def resolve(files, env_vars):
    """The resolved compose config (a dict) of FILES with ENV_VARS set, as compose sees it."""
    env = dict(os.environ)
    env.update(env_vars)
    if shutil.which("docker-compose"):
        argv = ["docker-compose"]
        for f in files:
            argv += ["-f", f]
        r = subprocess.run(argv + ["config"], env=env, capture_output=True, text=True)
        if r.returncode != 0:
            raise ValueError(f"docker-compose config refused {files}: {r.stderr.strip()}")
        import yaml
        return yaml.safe_load(r.stdout)
    import yaml
    cfg = {}
    for f in files:  # the subset of interpolation and merging our files use
        text = open(f).read()
        text = re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m.group(1), m.group(2)), text)
        for m in re.finditer(r"\$\{(\w+):\?([^}]*)\}", text):
            if not env.get(m.group(1)):
                raise ValueError(f"{f}: {m.group(1)} is required: {m.group(2)}")
        text = re.sub(r"\$\{(\w+):\?[^}]*\}", lambda m: env[m.group(1)], text)
        doc = yaml.safe_load(text)
        for name, svc in doc.get("services", {}).items():
            base = cfg.setdefault("services", {}).setdefault(name, {})
            for k, v in svc.items():
                if k == "environment":
                    base.setdefault(k, {}).update(v)
                elif k == "volumes":
                    base[k] = base.get(k, []) + v
                else:
                    base[k] = v
        for k in ("volumes",):
            cfg.setdefault(k, {}).update(doc.get(k) or {})
    return cfg


def command0(svc):
    cmd = svc.get("command") or []
    if isinstance(cmd, str):
        cmd = cmd.split()
    return cmd[0] if cmd else ""


def daemon_services(cfg):
    return {n: s for n, s in cfg["services"].items() if command0(s) in DAEMONS}


def by_daemon(cfg, daemon):
    return [(n, s) for n, s in cfg["services"].items() if command0(s) == daemon]


def joined(svc, key):
    """The service whose KEY (pid or ipc) namespace SVC joins, or None."""
    v = str(svc.get(key) or "")
    return v[len("service:"):] if v.startswith("service:") else None


def restart_policy(svc):
    return str(svc.get("restart") or "no")


def check_namespaces(cfg):
    errs = []
    services = cfg["services"]
    daemons = daemon_services(cfg)
    for name, svc in services.items():
        for key in ("pid", "ipc"):
            holder = joined(svc, key)
            if holder is None:
                continue
            if holder not in services:
                errs.append(f"{name}: {key} joins unknown service {holder}")
            elif holder in daemons and key == "pid":
                errs.append(f"{name}: pid: \"service:{holder}\" joins the PID namespace of a "
                            f"daemon ({command0(services[holder])}): when it exits, the kernel "
                            f"SIGKILLs every process of {name}")
            elif holder in daemons:
                errs.append(f"{name}: ipc: \"service:{holder}\" joins the IPC namespace of a "
                            f"daemon ({command0(services[holder])}): once it restarts, {name} no "
                            f"longer shares its /dev/shm")
    gpu_side = by_daemon(cfg, "dflash-target") + by_daemon(cfg, "dflash-drafter")
    for key in ("pid", "ipc"):
        holders = {joined(s, key) for _, s in gpu_side}
        if len(holders) != 1 or None in holders:
            errs.append(f"target and drafters do not all join one {key} namespace holder "
                        f"(they join {sorted(map(str, holders))}); CUDA IPC and the host "
                        f"backend need one")
    holder = joined(gpu_side[0][1], "ipc") if gpu_side else None
    if holder in services and holder not in daemons:
        h = services[holder]
        for key, want in (("ipc", "shareable"), ("init", True)):
            if h.get(key) != want:
                errs.append(f"{holder}: the namespace holder needs {key}: {want}")
        if not h.get("shm_size"):
            errs.append(f"{holder}: the IPC namespace holder owns /dev/shm and needs shm_size")
        if restart_policy(h) not in ("always", "unless-stopped"):
            errs.append(f"{holder}: the namespace holder must come back (restart: unless-stopped)")
    for name, svc in gpu_side:
        if not restart_policy(svc).startswith("on-failure"):
            errs.append(f"{name}: restart: {restart_policy(svc)}; a drained {command0(svc)} exits "
                        f"0 and must stay down (restart: on-failure)")
    return errs


def expect(label, errs, want=None):
    """Pass when ERRS is empty, or, with WANT, when one of ERRS contains WANT."""
    if want is not None:
        hit = [e for e in errs if want in e]
        if not hit:
            print(f"FAIL: {label}: a broken copy passed (no error about {want!r})")
            return 1
        print(f"ok: {label}: {hit[0]}")
        return 0
    if errs:
        print(f"FAIL: {label}:")
        for e in errs:
            print(f"  - {e}")
        return 1
    print(f"ok: {label}")
    return 0


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    try:
        import yaml  # noqa: F401
    except ImportError:
        print("SKIPPED: PyYAML missing")
        return 77
    deploy = os.path.join(sys.argv[1], "deploy")
    base = os.path.join(deploy, "docker-compose.yml")
    rc = 0
    try:
        cfg = resolve([base], {})
    except ValueError as e:
        print(f"FAIL: {e}")
        return 1
    rc |= expect("namespaces and restart policies", check_namespaces(cfg))

    # each rule must be able to fail: the old layout (drafters in the target's namespaces) and
    # the old policy (the target back after a drain)
    target = by_daemon(cfg, "dflash-target")[0][0]
    broken = copy.deepcopy(cfg)
    for n, s in by_daemon(broken, "dflash-drafter"):
        s["pid"] = s["ipc"] = f"service:{target}"
    rc |= expect("refused: drafters in the target's namespaces", check_namespaces(broken),
                 "SIGKILLs every process of")
    broken = copy.deepcopy(cfg)
    broken["services"][target]["restart"] = "unless-stopped"
    rc |= expect("refused: a target restarted unless-stopped", check_namespaces(broken),
                 "must stay down")
    return rc


if __name__ == "__main__":
    sys.exit(main())
