#!/usr/bin/env python3
"""ctest_skips: the tests a ctest run did not run, and why, read from its JUnit file
(`ctest --output-junit FILE`); scripts/test calls it after every ctest run.

    ctest_skips.py JUNIT [--strict] [--allow NAME=WHY]...

A test that exits with its SKIP_RETURN_CODE (77 here: torch, Docker, node missing) counts as not
failed, and ctest's last line still says "100% tests passed": without this list a CI run passes
with every PyTorch oracle skipped. Prints, after the run, one line per test that did not run
(JUnit status "notrun" or "disabled") with its reason: the last line of its output. Without
--strict that is all (exit 0). With --strict (scripts/test under CI=true) a test that did not run
and is not named by an --allow fails the run: exit 1, naming each such test and its reason; an
allowed one is listed with the WHY that allows it. Exit 2 when JUNIT cannot be read.
"""
import sys
import xml.etree.ElementTree as ET


def reason(case):
    """The last non-empty line of the test's output, else ctest's skip message."""
    out = case.findtext("system-out") or ""
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    if lines:
        return lines[-1][:300]
    sk = case.find("skipped")
    return sk.get("message", "no output") if sk is not None else "no output"


def main(argv):
    args, strict, allow = [], False, {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--strict":
            strict = True
        elif a == "--allow" and i + 1 < len(argv) and "=" in argv[i + 1]:
            name, why = argv[i + 1].split("=", 1)
            allow[name] = why
            i += 1
        elif a.startswith("-"):
            print("ctest_skips: bad argument %s (see the usage at the top of %s)" % (a, __file__),
                  file=sys.stderr)
            return 2
        else:
            args.append(a)
        i += 1
    if len(args) != 1:
        print("usage: ctest_skips.py JUNIT [--strict] [--allow NAME=WHY]...", file=sys.stderr)
        return 2
    try:
        root = ET.parse(args[0]).getroot()
    except (OSError, ET.ParseError) as e:
        print("ctest_skips: cannot read ctest's JUnit file %s: %s" % (args[0], e), file=sys.stderr)
        return 2
    skipped = [(c.get("name"), reason(c)) for c in root.iter("testcase")
               if c.get("status") in ("notrun", "disabled")]
    if not skipped:
        return 0
    bad = [(n, r) for n, r in skipped if n not in allow]
    print("\n%d test%s did not run (skipped):" % (len(skipped), "" if len(skipped) == 1 else "s"))
    for n, r in skipped:
        note = "  [allowed under CI: %s]" % allow[n] if n in allow else ""
        print("  %s: %s%s" % (n, r, note))
    if strict and bad:
        print("FAIL: under CI every test must run, and %d did not: %s. A skip is no pass: "
              "install what %s (scripts/install-deps; the PyTorch oracles take "
              "DFLASH_REFERENCE_PYTHON, default /usr/bin/python3, which must import torch)."
              % (len(bad), ", ".join(n for n, _ in bad), "they need" if len(bad) > 1 else
                 "it needs"), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
