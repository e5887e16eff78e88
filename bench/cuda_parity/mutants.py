#!/usr/bin/env python3
"""mutants.py: a mutation audit of the cuda kernels against the GPU parity checks.

Each mutant of mutants.json is one small semantic change to a kernel source (an off-by-one, a
flipped mask, a wrong scale, a dropped term): name, file, old (a text that occurs once in the
file), new, and what wrong program it is (why) and the rows that failed for it last (killed_by). `build` compiles, on the build machine, one pair of
parity binaries per mutant (bench-cuda_parity: every op and a training step, cuda against cpu;
bench-target_parity: the whole target forward) and packs them, with the unmutated pair as the
control, into one solid archive (the binaries differ in one object each, so xz keeps it small
enough to carry). `run`, on the GPU machine, runs every pair and prints one line per mutant:
KILLED (a check failed, the binary crashed or ran past its time; the failing rows named) or
SURVIVED (both passed: the parity checks would let that wrong kernel through). The control must
pass, else nothing counts. Each run's output is kept as OUT_DIR/bins/NAME/BINARY.log.

  build MUTS.json BUILD_DIR OUT_DIR [NAME...]   (repository root; BUILD_DIR a configured CUDA
                                                 Release tree; leaves OUT_DIR/mutants.tar.xz)
  run [--variants] OUT_DIR [PARALLEL=4] [TIMEOUT_S=300] [BUDGET_S]
                                                (GPU machine; OUT_DIR holding mutants.tar.xz,
                                                 LD_LIBRARY_PATH set as for scripts/gpu-check;
                                                 no mutant starts past BUDGET_S: NOT RUN;
                                                 --variants: variants.sh's runs too)

Exit 0 when the control passed (whatever the mutants did), 1 when it did not, 2 on bad usage.
The sources are restored after each mutant and on any exit of `build`.
"""
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time

BINARIES = ("bench-cuda_parity", "bench-target_parity")


def die(msg, code=2):
    print(f"mutants.py: {msg}", file=sys.stderr)
    sys.exit(code)


def load_mutants(path, names):
    muts = json.load(open(path))
    seen = set()
    for m in muts:
        for key in ("name", "file", "old", "new"):
            if key not in m:
                die(f"{path}: a mutant lacks '{key}': {m}")
        if m["name"] in seen or m["name"] == "control":
            die(f"{path}: mutant name '{m['name']}' used twice or reserved")
        seen.add(m["name"])
    if names:
        unknown = set(names) - seen
        if unknown:
            die(f"no such mutant: {', '.join(sorted(unknown))}")
        muts = [m for m in muts if m["name"] in names]
    return muts


def build_pair(build_dir, dest):
    """Builds both parity binaries in build_dir and copies them, stripped, into dest."""
    r = subprocess.run(["cmake", "--build", build_dir, "-j2", "--target", *BINARIES],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return "\n".join(l for l in r.stdout.splitlines() if "error" in l)[:400] or "build failed"
    os.makedirs(dest, exist_ok=True)
    for b in BINARIES:
        out = os.path.join(dest, b)
        shutil.copy(os.path.join(build_dir, "bench", b), out)
        subprocess.run(["strip", out], check=True)
    return None


def cmd_build(muts_path, build_dir, out_dir, names):
    muts = load_mutants(muts_path, names)
    stage = os.path.join(out_dir, "bins")
    shutil.rmtree(stage, ignore_errors=True)
    os.makedirs(stage)
    originals = {}
    try:
        err = build_pair(build_dir, os.path.join(stage, "control"))
        if err:
            die(f"the unmutated tree does not build: {err}", 1)
        built = []
        for i, m in enumerate(muts):
            src = originals.setdefault(m["file"], open(m["file"]).read())
            if src.count(m["old"]) != 1:
                print(f"[{i + 1}/{len(muts)}] {m['name']}: 'old' occurs {src.count(m['old'])} "
                      f"times in {m['file']}: skipped", flush=True)
                continue
            with open(m["file"], "w") as f:
                f.write(src.replace(m["old"], m["new"], 1))
            t0 = time.time()
            err = build_pair(build_dir, os.path.join(stage, m["name"]))
            with open(m["file"], "w") as f:
                f.write(src)
            state = f"does not compile: {err}" if err else f"built ({time.time() - t0:.0f} s)"
            print(f"[{i + 1}/{len(muts)}] {m['name']}: {state}", flush=True)
            if not err:
                built.append(m)
        with open(os.path.join(stage, "mutants.json"), "w") as f:
            json.dump(built, f, indent=1)
    finally:
        for path, src in originals.items():
            with open(path, "w") as f:
                f.write(src)
        build_pair(build_dir, os.path.join(out_dir, "restored"))  # the tree as it was again
        shutil.rmtree(os.path.join(out_dir, "restored"), ignore_errors=True)
    archive = os.path.join(out_dir, "mutants.tar.xz")
    subprocess.run(f"tar -C {stage} -cf - . | xz -9e -T2 > {archive}", shell=True, check=True)
    shutil.rmtree(stage)
    print(f"{len(built)} mutants and the control in {archive} "
          f"({os.path.getsize(archive) / 1e6:.1f} MB)")


VARIANTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "variants.sh")


def run_pair(folder, timeout_s, deadline=None, variants=False):
    """Runs both binaries of one folder (with variants, then variants.sh on bench-cuda_parity);
    returns (killed, why, seconds), killed None when the deadline passed before it started."""
    t0 = time.time()
    if deadline is not None and t0 > deadline:
        return None, "not run: past the budget", 0.0
    runs = [(b, [os.path.join(folder, b)]) for b in BINARIES]
    if variants:
        runs.append(("variants.sh", [VARIANTS, os.path.join(folder, BINARIES[0])]))
    for b, argv in runs:
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return True, f"{b}: past {timeout_s} s", time.time() - t0
        with open(os.path.join(folder, b + ".log"), "w") as f:  # kept beside the binary
            f.write(r.stdout + r.stderr)
        if r.returncode != 0:
            lines = r.stdout.splitlines()
            fails = []  # the failing rows: their op and tensor columns (37 wide), each once
            for l in lines:
                row = " ".join(l[:37].split())
                if "FAIL" in l and row not in fails:
                    fails.append(row)
            tail = lines[-1].strip() if lines else r.stderr.strip()[-200:]
            why = f"{b}: exit {r.returncode}: {tail}" + (f" | {' | '.join(fails)}" if fails else "")
            return True, why[:1200], time.time() - t0
    return False, "both passed", time.time() - t0


def cmd_run(out_dir, parallel, timeout_s, budget_s, variants):
    start = time.time()
    stage = os.path.join(out_dir, "bins")
    shutil.rmtree(stage, ignore_errors=True)
    os.makedirs(stage)
    with tarfile.open(os.path.join(out_dir, "mutants.tar.xz")) as t:
        t.extractall(stage)
    muts = json.load(open(os.path.join(stage, "mutants.json")))
    killed, why, secs = run_pair(os.path.join(stage, "control"), timeout_s, None, variants)
    print(f"control: {'FAILED: ' + why if killed else 'passed'} ({secs:.0f} s)", flush=True)
    if killed:
        return 1
    survived, not_run = [], []
    deadline = start + budget_s if budget_s else None
    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
        futs = {pool.submit(run_pair, os.path.join(stage, m["name"]), timeout_s, deadline,
                            variants): m for m in muts}
        for fut in concurrent.futures.as_completed(futs):
            m = futs[fut]
            killed, why, secs = fut.result()
            if killed is None:
                not_run.append(m["name"])
                continue
            print(f"{m['name']:14s} {'KILLED  ' if killed else 'SURVIVED'} {secs:5.0f} s  "
                  f"{m['file']}: {why}", flush=True)
            if not killed:
                survived.append(m)
    ran = len(muts) - len(not_run)
    print(f"{ran - len(survived)} of {ran} mutants run killed"
          + (f"; not run (budget): {' '.join(not_run)}" if not_run else "") + "; survivors:")
    for m in survived:
        print(f"  {m['name']}: {m['file']}: {m.get('why', '')}")
    return 0


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(argv) >= 2 else 2
    if argv[1] == "build" and len(argv) >= 5:
        cmd_build(argv[2], argv[3], argv[4], argv[5:])
        return 0
    variants = argv[1] == "run" and "--variants" in argv
    args = [a for a in argv if a != "--variants"] if argv[1] == "run" else argv
    if args[1] == "run" and 3 <= len(args) <= 6:
        try:
            parallel = int(args[3]) if len(args) > 3 else 4
            timeout_s = int(args[4]) if len(args) > 4 else 300
            budget_s = int(args[5]) if len(args) > 5 else 0
        except ValueError:
            die("PARALLEL, TIMEOUT_S and BUDGET_S are whole numbers")
        return cmd_run(args[2], parallel, timeout_s, budget_s, variants)
    die("usage: mutants.py build MUTS.json BUILD_DIR OUT_DIR [NAME...] | run [--variants] "
        "OUT_DIR [PARALLEL] [TIMEOUT_S] [BUDGET_S] (see --help)")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
