"""refdump: writes the reference-dump format the C reference tests read (refdump.h).

File layout (little-endian):
    magic    8 bytes  b"DFREFDMP"
    version  u32      1
    count    u32      number of tensors
    count x { name_len u32, name bytes (utf-8, no NUL), dtype u32 (0 = f32, 1 = i32),
              ndim u32, dims i64[ndim], data (prod(dims) elements, row-major) }

Usage:
    d = RefDump()
    d.add("rmsnorm.x", tensor)      # torch tensor or numpy array; floats stored f32, ints i32
    d.write(path)
"""
import struct

import numpy as np

MAGIC = b"DFREFDMP"
VERSION = 1
F32, I32 = 0, 1


class RefDump:
    def __init__(self):
        self.tensors = []
        self.names = set()

    def add(self, name, t):
        if name in self.names:
            raise ValueError("duplicate tensor name " + name)
        if hasattr(t, "detach"):
            t = t.detach().cpu().numpy()
        a = np.asarray(t)
        if a.dtype.kind in "fc":
            a, dt = np.ascontiguousarray(a, dtype="<f4"), F32
        elif a.dtype.kind in "iub":
            a, dt = np.ascontiguousarray(a, dtype="<i4"), I32
        else:
            raise TypeError("unsupported dtype %s for %s" % (a.dtype, name))
        self.names.add(name)
        self.tensors.append((name, dt, a))

    def write(self, path):
        with open(path, "wb") as f:
            f.write(MAGIC)
            f.write(struct.pack("<II", VERSION, len(self.tensors)))
            for name, dt, a in self.tensors:
                nb = name.encode()
                f.write(struct.pack("<I", len(nb)))
                f.write(nb)
                f.write(struct.pack("<II", dt, a.ndim))
                f.write(struct.pack("<%dq" % a.ndim, *a.shape))
                f.write(a.tobytes())
