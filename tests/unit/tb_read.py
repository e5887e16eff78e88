#!/usr/bin/env python3
"""tb_read: an independent reader of TensorBoard event files, used by test_metrics.

It shares no code with common/metrics.c: the TFRecord framing, CRC32C (Castagnoli), the mask
and the protobuf wire format are decoded here by hand (no protobuf or tensorflow package).

    tb_read.py EVENTS [--jsonl METRICS.JSONL]

Prints one line "step<TAB>tag<TAB>value" per scalar (value as float32 repr). Exits 1 with a
message on any framing, CRC or decoding error, when the first record is not file_version
"brain.Event:2", or (with --jsonl) when a number in the JSONL has no equal float32 scalar at
the same step in the event file.
"""
import json
import math
import struct
import sys


def crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


TABLE = crc32c_table()


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc = TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def fail(msg):
    print("tb_read: " + msg, file=sys.stderr)
    sys.exit(1)


def records(buf):
    off = 0
    n = 0
    while off < len(buf):
        if off + 12 > len(buf):
            fail("record %d: truncated header at byte %d" % (n, off))
        (length,) = struct.unpack_from("<Q", buf, off)
        (len_crc,) = struct.unpack_from("<I", buf, off + 8)
        if masked(crc32c(buf[off:off + 8])) != len_crc:
            fail("record %d: length CRC mismatch" % n)
        start = off + 12
        end = start + length
        if end + 4 > len(buf):
            fail("record %d: truncated data" % n)
        data = buf[start:end]
        (data_crc,) = struct.unpack_from("<I", buf, end)
        if masked(crc32c(data)) != data_crc:
            fail("record %d: data CRC mismatch" % n)
        yield data
        off = end + 4
        n += 1


def varint(buf, off):
    shift = 0
    v = 0
    while True:
        if off >= len(buf):
            fail("truncated varint")
        b = buf[off]
        off += 1
        v |= (b & 0x7F) << shift
        if not b & 0x80:
            return v, off
        shift += 7
        if shift > 63:
            fail("varint too long")


def fields(buf):
    """Yields (field number, wire type, value): int for varint, bytes for the others."""
    off = 0
    while off < len(buf):
        key, off = varint(buf, off)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, off = varint(buf, off)
        elif wt == 1:
            v = buf[off:off + 8]
            off += 8
        elif wt == 2:
            n, off = varint(buf, off)
            v = buf[off:off + n]
            off += n
        elif wt == 5:
            v = buf[off:off + 4]
            off += 4
        else:
            fail("unsupported wire type %d" % wt)
        if off > len(buf):
            fail("field %d overruns its message" % num)
        yield num, wt, v


def decode_event(data):
    ev = {"wall_time": None, "step": 0, "file_version": None, "values": []}
    for num, wt, v in fields(data):
        if num == 1 and wt == 1:
            ev["wall_time"] = struct.unpack("<d", v)[0]
        elif num == 2 and wt == 0:
            ev["step"] = v - (1 << 64) if v >= 1 << 63 else v
        elif num == 3 and wt == 2:
            ev["file_version"] = v.decode()
        elif num == 5 and wt == 2:
            for snum, swt, sv in fields(v):
                if snum != 1 or swt != 2:
                    fail("unexpected Summary field %d" % snum)
                tag, val = None, None
                for vnum, vwt, vv in fields(sv):
                    if vnum == 1 and vwt == 2:
                        tag = vv.decode()
                    elif vnum == 2 and vwt == 5:
                        val = struct.unpack("<f", vv)[0]
                    else:
                        fail("unexpected Value field %d" % vnum)
                if tag is None or val is None:
                    fail("Value without tag or simple_value")
                ev["values"].append((tag, val))
        else:
            fail("unexpected Event field %d wire type %d" % (num, wt))
    return ev


FIXED = {
    "loss": "train/loss",
    "accuracy": "train/accuracy",
    "acceptance_length": "train/acceptance_length",
    "lr": "train/lr",
    "grad_norm": "train/grad_norm",
    "tokens_per_s": "perf/tokens_per_s",
    "samples_per_s": "perf/samples_per_s",
}


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def same(a, b):
    return (math.isnan(a) and math.isnan(b)) or a == b


def check_jsonl(path, events):
    by_step = {}
    for ev in events:
        by_step.setdefault(ev["step"], []).append(dict(ev["values"]))
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            rec = json.loads(line)
            step = rec["step"]
            expect = {}
            for k, v in rec.items():
                if k in ("step", "time"):
                    continue
                if k == "pos_acc":
                    for i, a in enumerate(v):
                        expect["train/pos_acc/%02d" % i] = a
                else:
                    expect[FIXED.get(k, k)] = v
            ok = False
            for vals in by_step.get(step, []):
                # null in JSON: not finite in the event, or (pos_acc) not reported at all
                if all(tag not in vals and v is None and tag.startswith("train/pos_acc/")
                       or tag in vals and (v is None and not math.isfinite(vals[tag])
                                           or v is not None and same(f32(v), vals[tag]))
                       for tag, v in expect.items()):
                    ok = True
                    break
            if not ok:
                fail("%s:%d: step %d has no matching event" % (path, lineno, step))


def main():
    args = sys.argv[1:]
    jsonl = None
    if "--jsonl" in args:
        i = args.index("--jsonl")
        jsonl = args[i + 1]
        del args[i:i + 2]
    if len(args) != 1:
        fail("usage: tb_read.py EVENTS [--jsonl METRICS.JSONL]")
    with open(args[0], "rb") as f:
        buf = f.read()
    events = [decode_event(r) for r in records(buf)]
    if not events or events[0]["file_version"] != "brain.Event:2":
        fail("first record is not file_version brain.Event:2")
    for ev in events:
        if ev["wall_time"] is None:
            fail("event without wall_time")
    body = events[1:]
    for ev in body:
        for tag, val in ev["values"]:
            print("%d\t%s\t%r" % (ev["step"], tag, val))
    if jsonl:
        check_jsonl(jsonl, body)


if __name__ == "__main__":
    main()
