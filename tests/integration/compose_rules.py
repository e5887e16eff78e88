#!/usr/bin/env python3
"""compose_rules: deploy/docker-compose.yml keeps the promises deploy/README.md makes.

compose_schema checks that the file is valid compose; this checks that what it describes works,
without docker. The file is resolved as an operator would run it (`docker-compose config`, or
PyYAML with ${VAR:-default} interpolation and `VAR:` passed through from the environment when
docker-compose is missing) and each rule below is checked; then each rule is broken on purpose
in a copy, which must be refused (so no rule is a check that cannot fail).

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
    is told to shut down and exits again, over and over);
  * no target or drafter sets a fixed DFLASH_NAME: the replicas of `--scale` would share it, and
    the broker lets only one process hold a name (the others exit 4, then come back).

Training (docker-compose.yml with docker-compose.train.yml over it, given a model and shards):
  * a target that runs a model has DFLASH_SHARDS, and its model and shards lie on its mounts;
  * a drafter that does not verify has DFLASH_MODEL (the target's), DFLASH_CHECKPOINT_DIR and
    DFLASH_METRICS_DIR, each on a mount (else nothing survives the container), and
    DFLASH_DRAFT_LAYERS (the daemon's default, 1 layer, is not the recipe's 5); a verifying
    drafter needs the synthetic target;
  * the override refuses to resolve without DFLASH_TARGET_MODEL or DFLASH_SHARDS.

Several GPUs (docker-compose.group.yml over the training files, given DFLASH_DRAFTER_GPUS):
  * the drafter service runs the group launcher, dflash-drafter-group (deploy/drafter-group),
    which the Dockerfile installs under that name, executable; a service with
    DFLASH_DRAFTER_GPUS runs it, and it has DFLASH_DRAFTER_GPUS (comma-separated ordinals);
  * it counts as a drafter for every rule above (namespaces, restart on-failure, no fixed name,
    checkpoint and metrics directories on volumes, the stop grace);
  * the overlay refuses to resolve without DFLASH_DRAFTER_GPUS.

Stopping: the broker's graceful stop (DFLASH_STOP_GRACE_MS, set next to its stop_grace_period)
ends at least a second before its service's stop_grace_period (docker's 10 s when unset) sends
SIGKILL, else a stop cut short by it journals nothing of the stop (a drain it should end stays);
the drafters' stop_grace_period is at least the broker's (they stop with it, and write their
final checkpoint after the acks it waits for). The namespace holder, whose exit SIGKILLs every
target and drafter and which docker stops with them in no order (a host shutdown, `compose
restart`, a recreated image), passes a stop on to the namespace's processes and waits for them
(kill -TERM -1, kill -0 -1) as root (a process of any uid), and its stop_grace_period is above
each of theirs.

Steering: the defaults and every `dflash-ctl set min_ready=M max_depth=D` in deploy/README.md
keep min_ready <= max_depth <= the target's DFLASH_SLOTS (min_ready above the slots stalls).

Usage: compose_rules.py SOURCE_DIR   exit 0 pass, 1 fail, 77 skipped (no PyYAML)
"""
import copy
import os
import re
import shutil
import subprocess
import sys

LAUNCHER = "dflash-drafter-group"  # runs a dflash-drafter per GPU: a drafter to every rule
DAEMONS = {"dflash-queue", "dflash-target", "dflash-drafter", LAUNCHER}


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
    # `VAR:` without a value passes VAR through from compose's environment, as docker-compose
    # config resolves it (left out, these fell back to the daemons' defaults where no
    # docker-compose is installed: compose_group then checkpointed every 500 steps, not 2, and
    # timed out on a loaded 16-core machine)
    for svc in cfg.get("services", {}).values():
        environment = svc.get("environment") or {}
        for k, v in environment.items():
            if v is None and k in env:
                environment[k] = env[k]
    return cfg


def command0(svc):
    cmd = svc.get("command") or []
    if isinstance(cmd, str):
        cmd = cmd.split()
    return cmd[0] if cmd else ""


def daemon_services(cfg):
    return {n: s for n, s in cfg["services"].items() if command0(s) in DAEMONS}


def role(svc):
    """The daemon a service runs: the group launcher's services are drafters."""
    return "dflash-drafter" if command0(svc) == LAUNCHER else command0(svc)


def by_daemon(cfg, daemon):
    return [(n, s) for n, s in cfg["services"].items() if role(s) == daemon]


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


def check_names(cfg):
    """No target or drafter has a fixed DFLASH_NAME: `--scale` replicas would share it."""
    errs = []
    for name, svc in by_daemon(cfg, "dflash-target") + by_daemon(cfg, "dflash-drafter"):
        fixed = env_of(svc).get("DFLASH_NAME")
        if fixed:
            errs.append(f"{name}: DFLASH_NAME {fixed}: every replica of `--scale {name}=N` gets "
                        f"that name; the broker lets one run, the others exit 4 and restart "
                        f"(on-failure) to take the name over, again and again")
    return errs


def env_of(svc):
    return {k: ("" if v is None else str(v)) for k, v in (svc.get("environment") or {}).items()}


def mounts(svc):
    """Container paths of SVC's volumes (short "src:dst[:mode]" or long syntax)."""
    out = []
    for v in svc.get("volumes") or []:
        out.append(v.get("target", "") if isinstance(v, dict) else str(v).split(":")[1])
    return out


def on_mount(path, svc):
    return any(m and (path == m or path.startswith(m.rstrip("/") + "/")) for m in mounts(svc))


def falsy(v):
    return v.strip().lower() in ("", "0", "false", "no", "off")


def check_training(cfg):
    errs = []
    targets = by_daemon(cfg, "dflash-target")
    target_models = {env_of(s).get("DFLASH_MODEL", "synthetic") for _, s in targets}
    for name, svc in targets:
        e = env_of(svc)
        model = e.get("DFLASH_MODEL", "synthetic")
        if model == "synthetic":
            continue
        if not e.get("DFLASH_SHARDS"):
            errs.append(f"{name}: DFLASH_MODEL {model} without DFLASH_SHARDS: the target refuses "
                        f"to start (--model needs --shards)")
        for path in [model] + [p for p in e.get("DFLASH_SHARDS", "").split(",") if p]:
            if not on_mount(path, svc):
                errs.append(f"{name}: {path} is on no volume of the service")
    for name, svc in by_daemon(cfg, "dflash-drafter"):
        e = env_of(svc)
        if not falsy(e.get("DFLASH_VERIFY", "false")):
            if target_models != {"synthetic"}:
                errs.append(f"{name}: verifies, but the target runs {sorted(target_models)}; "
                            f"--verify needs the synthetic target")
            continue
        if falsy(e.get("DFLASH_TRAIN", "false")) and not e.get("DFLASH_MODEL"):
            errs.append(f"{name}: neither verifies nor trains: without DFLASH_MODEL the drafter "
                        f"refuses to start (choose one mode)")
            continue
        model = e.get("DFLASH_MODEL", "")
        if not model:
            errs.append(f"{name}: trains without DFLASH_MODEL (the target's checkpoint)")
        elif model not in target_models:
            errs.append(f"{name}: DFLASH_MODEL {model} is not the target's "
                        f"({sorted(target_models)})")
        elif not on_mount(model, svc):
            errs.append(f"{name}: {model} is on no volume of the service")
        if not e.get("DFLASH_DRAFT_LAYERS"):
            errs.append(f"{name}: trains without DFLASH_DRAFT_LAYERS: the daemon's default is 1 "
                        f"layer, the recipe's drafter has 5")
        for key in ("DFLASH_CHECKPOINT_DIR", "DFLASH_METRICS_DIR"):
            path = e.get(key, "")
            if not path:
                errs.append(f"{name}: trains without {key}: nothing of it is saved")
            elif not on_mount(path, svc):
                errs.append(f"{name}: {key} {path} is on no volume: lost with the container")
    return errs


def check_group(cfg, dockerfile_text, launcher_path):
    """The several-GPU drafter: the launcher, installed by the Dockerfile, with its GPUs."""
    errs = []
    runs = [n for n, s in cfg["services"].items() if command0(s) == LAUNCHER]
    for name, svc in cfg["services"].items():
        gpus = env_of(svc).get("DFLASH_DRAFTER_GPUS", "")
        if name in runs and not re.fullmatch(r"\d+(,\d+)*", gpus):
            errs.append(f"{name}: runs {LAUNCHER} with DFLASH_DRAFTER_GPUS '{gpus}': it needs "
                        f"the drafters' GPU ordinals (1,2,3) and refuses to start without")
        elif name not in runs and gpus:
            errs.append(f"{name}: DFLASH_DRAFTER_GPUS {gpus} but the command is "
                        f"{command0(svc) or 'none'}, not {LAUNCHER}: one drafter trains on one GPU")
    if runs:
        if not re.search(rf"^COPY\s+deploy/drafter-group\s+/usr/local/bin/{LAUNCHER}\s*$",
                         dockerfile_text, re.M):
            errs.append(f"the Dockerfile does not install deploy/drafter-group as "
                        f"/usr/local/bin/{LAUNCHER}: {', '.join(runs)} would not start")
        if not os.access(launcher_path, os.X_OK):
            errs.append(f"{launcher_path} is not executable (COPY keeps the mode)")
    return errs


def duration_ms(text, default_ms):
    """A compose duration ("10s", "1m30s", "500ms", seconds as a number) in ms."""
    if text is None:
        return default_ms
    if isinstance(text, (int, float)):
        return int(text * 1000)
    total = 0
    for num, unit in re.findall(r"([\d.]+)(ms|us|h|m|s)", str(text)):
        total += float(num) * {"h": 3600e3, "m": 60e3, "s": 1e3, "ms": 1, "us": 1e-3}[unit]
    return int(total)


def check_stop_grace(cfg):
    errs = []
    qname, queue = by_daemon(cfg, "dflash-queue")[0]
    period = duration_ms(queue.get("stop_grace_period"), 10000)
    grace = env_of(queue).get("DFLASH_STOP_GRACE_MS")
    if not grace:
        errs.append(f"{qname}: DFLASH_STOP_GRACE_MS unset: say how long the broker's stop waits, "
                    f"next to its stop_grace_period ({period} ms)")
        grace = "0"
    grace = int(grace)
    if grace + 1000 > period:
        errs.append(f"{qname}: the broker's stop grace ({grace} ms) does not end a second before "
                    f"its stop_grace_period ({period} ms): SIGKILL cuts the stop short")
    for name, svc in by_daemon(cfg, "dflash-drafter"):
        if duration_ms(svc.get("stop_grace_period"), 10000) < period:
            errs.append(f"{name}: stop_grace_period shorter than the broker's ({period} ms): "
                        f"its final checkpoint comes after the acks the broker waits for")
    gpu_side = by_daemon(cfg, "dflash-target") + by_daemon(cfg, "dflash-drafter")
    holder = joined(gpu_side[0][1], "pid") if gpu_side else None
    if holder in cfg["services"] and holder not in daemon_services(cfg):
        h = cfg["services"][holder]
        text = " ".join(map(str, h.get("command") or []))
        if "kill -TERM -1" not in text or "kill -0 -1" not in text:
            errs.append(f"{holder}: the PID namespace holder exits on a stop without passing it "
                        f"on (kill -TERM -1) and waiting for the namespace's processes (kill -0 "
                        f"-1): its exit SIGKILLs every target and drafter, mid-checkpoint")
        if str(h.get("user", "")) not in ("0", "root"):
            errs.append(f"{holder}: the PID namespace holder runs as user "
                        f"{h.get('user', 'of the image')}: it may not signal a process of "
                        f"another uid (an exec -u 0), which then holds its stop until SIGKILL "
                        f"(user: \"0\")")
        hp = duration_ms(h.get("stop_grace_period"), 10000)
        for name, svc in gpu_side:
            if duration_ms(svc.get("stop_grace_period"), 10000) >= hp:
                errs.append(f"{holder}: stop_grace_period ({hp} ms) not above {name}'s: the "
                            f"holder's SIGKILL ends {name} before its own stop does")
    return errs


def check_depth(cfg, readme_text):
    errs = []
    queue = by_daemon(cfg, "dflash-queue")[0][1]
    slots = sum(int(env_of(s).get("DFLASH_SLOTS", 0)) for _, s in by_daemon(cfg, "dflash-target"))
    q = env_of(queue)
    cases = [("the defaults", int(q["DFLASH_MIN_READY"]), int(q["DFLASH_MAX_DEPTH"]))]
    for m in re.finditer(r"dflash-ctl set min_ready=(\d+) max_depth=(\d+)", readme_text):
        cases.append((m.group(0), int(m.group(1)), int(m.group(2))))
    for what, min_ready, max_depth in cases:
        if not min_ready <= max_depth <= slots:
            errs.append(f"{what}: min_ready {min_ready}, max_depth {max_depth} with {slots} "
                        f"slots (needs min_ready <= max_depth <= slots)")
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
    rc |= expect("the synthetic verify run", check_training(cfg))
    rc |= expect("every replica gets its own peer name", check_names(cfg))
    readme = open(os.path.join(deploy, "README.md")).read()
    rc |= expect("min_ready and max_depth fit the slots", check_depth(cfg, readme))
    rc |= expect("the broker's stop grace fits its stop_grace_period", check_stop_grace(cfg))
    qname = by_daemon(cfg, "dflash-queue")[0][0]
    broken = copy.deepcopy(cfg)
    broken["services"][qname]["environment"]["DFLASH_STOP_GRACE_MS"] = "9500"
    rc |= expect("refused: a stop grace SIGKILL cuts short", check_stop_grace(broken),
                 "SIGKILL cuts the stop short")
    broken = copy.deepcopy(cfg)
    for n, s in by_daemon(broken, "dflash-drafter"):
        s["stop_grace_period"] = "5s"
    rc |= expect("refused: drafters stopped sooner than the broker", check_stop_grace(broken),
                 "shorter than the broker's")
    holder = joined(by_daemon(cfg, "dflash-target")[0][1], "pid")
    broken = copy.deepcopy(cfg)
    broken["services"][holder]["command"] = ["sh", "-c",
                                             "trap 'exit 0' TERM INT; sleep infinity & wait"]
    rc |= expect("refused: a holder that exits at once on a stop", check_stop_grace(broken),
                 "without passing it on")
    broken = copy.deepcopy(cfg)
    del broken["services"][holder]["user"]
    rc |= expect("refused: a holder of the image's user", check_stop_grace(broken),
                 "may not signal a process of another uid")
    broken = copy.deepcopy(cfg)
    for n, s in by_daemon(broken, "dflash-drafter"):
        s["stop_grace_period"] = "20m"
    rc |= expect("refused: drafters stopping longer than the holder", check_stop_grace(broken),
                 "not above")
    broken = copy.deepcopy(cfg)
    del broken["services"][qname]["environment"]["DFLASH_STOP_GRACE_MS"]
    rc |= expect("refused: the broker's stop grace unsaid", check_stop_grace(broken),
                 "DFLASH_STOP_GRACE_MS unset")
    rc |= expect("refused: min_ready above the slots",
                 check_depth(cfg, "dflash-ctl set min_ready=30 max_depth=90"), "min_ready 30")

    # training: the override if there is one; DFLASH_VERIFY=false was the older README's recipe
    train_files = [base] + [f for f in [os.path.join(deploy, "docker-compose.train.yml")]
                            if os.path.exists(f)]
    train_env = {"DFLASH_TARGET_MODEL": "/models/target", "DFLASH_SHARDS": "/data/train.shard",
                 "DFLASH_VERIFY": "false"}
    try:
        train = resolve(train_files, train_env)
    except ValueError as e:
        print(f"FAIL: the training configuration does not resolve: {e}")
        return 1
    rc |= expect("the training configuration (" + " + ".join(map(os.path.basename, train_files))
                 + ")", check_training(train) + check_namespaces(train))
    for var in ("DFLASH_TARGET_MODEL", "DFLASH_SHARDS"):
        try:
            resolve(train_files, {k: v for k, v in train_env.items() if k != var})
            print(f"FAIL: the training configuration resolves without {var}")
            rc = 1
        except ValueError:
            print(f"ok: refused: the training configuration without {var}")

    # each rule must be able to fail: the old layout (drafters in the target's namespaces) and
    # the old policy (the target back after a drain)
    target = by_daemon(cfg, "dflash-target")[0][0]
    broken = copy.deepcopy(cfg)
    for n, s in by_daemon(broken, "dflash-drafter"):
        s["pid"] = s["ipc"] = f"service:{target}"
    rc |= expect("refused: drafters in the target's namespaces", check_namespaces(broken),
                 "SIGKILLs every process of")
    broken = copy.deepcopy(cfg)
    broken["services"][target].setdefault("environment", {})["DFLASH_NAME"] = "target0"
    rc |= expect("refused: a fixed target name", check_names(broken), "DFLASH_NAME target0")
    broken = copy.deepcopy(cfg)
    broken["services"][target]["restart"] = "unless-stopped"
    rc |= expect("refused: a target restarted unless-stopped", check_namespaces(broken),
                 "must stay down")
    # the namespace holder: each of its four settings taken away in turn
    holder = joined(by_daemon(cfg, "dflash-target")[0][1], "ipc")
    for key, value, want in (("ipc", "private", "needs ipc: shareable"),
                             ("init", False, "needs init: True"),
                             ("shm_size", None, "needs shm_size"),
                             ("restart", "no", "must come back")):
        broken = copy.deepcopy(cfg)
        if value is None:
            broken["services"][holder].pop(key, None)
        else:
            broken["services"][holder][key] = value
        rc |= expect(f"refused: the holder with {key} {value}", check_namespaces(broken), want)
    broken = copy.deepcopy(cfg)
    for n, s in by_daemon(broken, "dflash-drafter"):
        s.pop("ipc", None)
    rc |= expect("refused: drafters outside the holder's IPC namespace",
                 check_namespaces(broken), "do not all join one ipc namespace holder")
    tname = by_daemon(train, "dflash-target")[0][0]
    dname = by_daemon(train, "dflash-drafter")[0][0]
    broken = copy.deepcopy(train)
    broken["services"][dname]["environment"]["DFLASH_VERIFY"] = "true"
    rc |= expect("refused: a verifying drafter beside a real target", check_training(broken),
                 "--verify needs the synthetic target")
    broken = copy.deepcopy(train)
    broken["services"][dname]["environment"]["DFLASH_MODEL"] = "/models/other"
    rc |= expect("refused: a drafter trained for another model", check_training(broken),
                 "is not the target's")
    for svc in (tname, dname):
        broken = copy.deepcopy(train)
        broken["services"][svc]["volumes"] = [v for v in broken["services"][svc]["volumes"]
                                              if "/models" not in str(v)]
        rc |= expect(f"refused: the {svc}'s model on no volume", check_training(broken),
                     "/models/target is on no volume")
    broken = copy.deepcopy(train)
    broken["services"][tname]["volumes"] = [v for v in broken["services"][tname]["volumes"]
                                            if "/data" not in str(v)]
    rc |= expect("refused: the shards on no volume", check_training(broken),
                 "/data/train.shard is on no volume")
    for svc, var, want in ((tname, "DFLASH_SHARDS", "without DFLASH_SHARDS"),
                           (dname, "DFLASH_MODEL", "without DFLASH_MODEL"),
                           (dname, "DFLASH_CHECKPOINT_DIR", "without DFLASH_CHECKPOINT_DIR"),
                           (dname, "DFLASH_METRICS_DIR", "without DFLASH_METRICS_DIR"),
                           (dname, "DFLASH_DRAFT_LAYERS", "without DFLASH_DRAFT_LAYERS")):
        broken = copy.deepcopy(train)
        broken["services"][svc]["environment"].pop(var, None)
        rc |= expect(f"refused: training without the {svc}'s {var}", check_training(broken), want)
    broken = copy.deepcopy(train)
    broken["services"][dname]["volumes"] = [v for v in broken["services"][dname]["volumes"]
                                            if "checkpoints" not in str(v)]
    rc |= expect("refused: checkpoints on no volume", check_training(broken), "lost with")
    rc |= check_group_files(deploy, train_files, train_env)
    return rc


def check_group_files(deploy, train_files, train_env):
    """docker-compose.group.yml over the training files: the rules, and each broken once."""
    group_file = os.path.join(deploy, "docker-compose.group.yml")
    if not os.path.exists(group_file):
        print("FAIL: deploy/docker-compose.group.yml is missing")
        return 1
    files = train_files + [group_file]
    group_env = dict(train_env, DFLASH_DRAFTER_GPUS="1,2,3")
    try:
        cfg = resolve(files, group_env)
    except ValueError as e:
        print(f"FAIL: the several-GPU configuration does not resolve: {e}")
        return 1
    dockerfile = open(os.path.join(deploy, "Dockerfile")).read()
    launcher = os.path.join(deploy, "drafter-group")
    rc = expect("the several-GPU configuration (+ docker-compose.group.yml)",
                check_group(cfg, dockerfile, launcher) + check_training(cfg) +
                check_namespaces(cfg) + check_names(cfg) + check_stop_grace(cfg))
    dname = [n for n, s in cfg["services"].items() if command0(s) == LAUNCHER]
    if dname != ["drafter"]:
        print(f"FAIL: the several-GPU configuration's drafter runs "
              f"{command0(cfg['services']['drafter'])}, not {LAUNCHER}")
        return 1
    try:
        resolve(files, train_env)
        print("FAIL: the several-GPU configuration resolves without DFLASH_DRAFTER_GPUS")
        rc = 1
    except ValueError:
        print("ok: refused: the several-GPU configuration without DFLASH_DRAFTER_GPUS")
    broken = copy.deepcopy(cfg)
    broken["services"]["drafter"]["command"] = ["dflash-drafter"]
    rc |= expect("refused: DFLASH_DRAFTER_GPUS on a plain drafter",
                 check_group(broken, dockerfile, launcher), "one drafter trains on one GPU")
    broken = copy.deepcopy(cfg)
    broken["services"]["drafter"]["environment"]["DFLASH_DRAFTER_GPUS"] = ""
    rc |= expect("refused: the launcher without its GPUs", check_group(broken, dockerfile, launcher),
                 "refuses to start without")
    rc |= expect("refused: a Dockerfile without the launcher",
                 check_group(cfg, dockerfile.replace("COPY deploy/drafter-group", "#"), launcher),
                 "does not install deploy/drafter-group")
    for key, want in (("DFLASH_CHECKPOINT_DIR", "without DFLASH_CHECKPOINT_DIR"),
                      ("DFLASH_METRICS_DIR", "without DFLASH_METRICS_DIR")):
        broken = copy.deepcopy(cfg)
        broken["services"]["drafter"]["environment"].pop(key)
        rc |= expect(f"refused: the group without {key}", check_training(broken), want)
    broken = copy.deepcopy(cfg)
    broken["services"]["drafter"]["volumes"] = [
        v for v in broken["services"]["drafter"]["volumes"] if "metrics" not in str(v)]
    rc |= expect("refused: the group's metrics on no volume", check_training(broken), "lost with")
    broken = copy.deepcopy(cfg)
    broken["services"]["drafter"]["restart"] = "always"
    rc |= expect("refused: the group restarted always", check_namespaces(broken), "must stay down")
    return rc


if __name__ == "__main__":
    sys.exit(main())
