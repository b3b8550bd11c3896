#!/usr/bin/env python3
"""Hostile and malformed tar checkpoints (the format of torch <= 0.1), each
one defect away from a good one.

usage: python3 tests/bad/make_bad_tar.py tests/bad

Plain Python (no torch).  The members are built as
tests/fixtures/make_tar_fixtures.py builds them (its stand-in `torch`
classes, protocol-2 pickles), then one thing is made wrong: a header's
checksum, a size, a count, a key, a dimension, a member's type.  Each file
must be refused by `ckpt inspect` (exit 3, one line); tests/cli/bad_inputs.sh
lists the message each one gets.  Nothing here is ever unpickled.
"""
import io
import os
import pickle
import struct
import sys
import tarfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures"))
import make_tar_fixtures as mk  # noqa: E402  (registers the stand-in torch classes)

T = mk.TORCH


def dump(obj):
    return pickle.dumps(obj, protocol=2)


class Ref:
    """A persistent id in the main pickle: str(KEY), as 0.1 wrote it."""

    def __init__(self, key):
        self.key = key


def main_pickle(obj):
    out = io.BytesIO()

    class P(pickle.Pickler):
        def persistent_id(self, o):
            return str(o.key) if isinstance(o, Ref) else None
    P(out, protocol=2).dump(obj)
    return out.getvalue()


def storages(items, views=(), count=None):
    """ITEMS: (key, location, class, values) float32 storages; the element
    count field is len(values) unless the item has a fifth entry."""
    b = io.BytesIO()
    b.write(dump(len(items) if count is None else count))
    for it in items:
        key, loc, cls, values = it[:4]
        b.write(dump((key, loc, cls)) if not isinstance(cls, bytes) else cls)
        b.write(struct.pack("<q", it[4] if len(it) > 4 else len(values)))
        b.write(struct.pack("<%df" % len(values), *values))
    b.write(dump(list(views)))
    return b.getvalue()


def tensors(items, count=None):
    """ITEMS: (key, storage key, sizes, strides, offset[, ndim field])."""
    b = io.BytesIO()
    b.write(dump(len(items) if count is None else count))
    for it in items:
        key, sid, sizes, strides, offset = it[:5]
        b.write(dump((key, sid, T.FloatTensor)))
        b.write(struct.pack("<q", it[5] if len(it) > 5 else len(sizes)))
        b.write(struct.pack("<%dq" % len(sizes), *sizes))
        b.write(struct.pack("<%dq" % len(strides), *strides))
        b.write(struct.pack("<q", offset))
    return b.getvalue()


SYS = dump(dict(protocol_version=1000, little_endian=True,
                type_sizes=dict(short=2, int=4, long=8)))
S1, T1, T2 = 94000000000064, 94000000000704, 94000000000768
GOOD_ST = [(S1, "cpu", T.FloatStorage, [float(i) for i in range(10)])]
GOOD_TE = [(T1, S1, [2, 5], [5, 1], 0), (T2, S1, [5], [1], 5)]
GOOD_MAIN = main_pickle({"a": Ref(T1), "b": Ref(T2)})


def parts(main=GOOD_MAIN, te=None, st=None):
    return [("sys_info", SYS), ("pickle", main), ("tensors", te or tensors(GOOD_TE)),
            ("storages", st or storages(GOOD_ST))]


def good():
    return mk.tar_bytes(parts())


def header(name, size, typ=b"0", extra=b""):
    """One ustar header block with a correct checksum."""
    h = bytearray(512)
    h[0:len(name)] = name
    h[100:108] = b"0000644\0"
    h[108:116] = b"0000000\0"
    h[116:124] = b"0000000\0"
    h[124:136] = b"%011o\0" % size
    h[136:148] = b"00000000000\0"
    h[156:157] = typ
    h[257:265] = b"ustar\x0000"
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def pad(data):
    return data + b"\0" * (-len(data) % 512)


def raw_tar(entries):
    """A tar of (header block, data) pairs as given, then two zero blocks."""
    return b"".join(h + pad(d) for h, d in entries) + b"\0" * 1024


def files():
    out = {}
    g = good()

    # the first header's checksum off by one: tarfile.open raises ReadError,
    # torch reads the file as a pickle stream, which it is not
    b = bytearray(g)
    b[148:156] = b"%06o\0 " % (int(bytes(b[148:154]), 8) + 1)
    out["tar_bad_checksum.pth"] = bytes(b)

    # cut inside the last member (storages): its data reaches past the end
    st_at = g.index(b"storages\0")
    out["tar_size_past_end.pth"] = g[:st_at + 512 + 40]

    out["tar_missing_member.pth"] = mk.tar_bytes(
        [p for p in parts() if p[0] != "tensors"])
    out["tar_count_lies.pth"] = mk.tar_bytes(parts(st=storages(GOOD_ST, count=3)))
    out["tar_ndim_huge.pth"] = mk.tar_bytes(parts(te=tensors(
        [(T1, S1, [2, 5], [5, 1], 0, 0x7fffffff)])))
    out["tar_negative_size.pth"] = mk.tar_bytes(parts(te=tensors(
        [(T1, S1, [-1, 5], [5, 1], 0), (T2, S1, [5], [1], 5)])))
    out["tar_storage_id_unknown.pth"] = mk.tar_bytes(parts(te=tensors(
        [(T1, S1 + 1, [2, 5], [5, 1], 0)])))
    out["tar_storage_id_tensor.pth"] = mk.tar_bytes(parts(te=tensors(
        [(T1, S1, [2, 5], [5, 1], 0), (T2, T1, [5], [1], 5)])))
    out["tar_element_count_lies.pth"] = mk.tar_bytes(parts(st=storages(
        [(S1, "cpu", T.FloatStorage, [float(i) for i in range(10)], 1000)])))
    out["tar_view_outside.pth"] = mk.tar_bytes(parts(st=storages(
        GOOD_ST, views=[(S1 + 64, S1, 8, 5)])))
    out["tar_stride_outside.pth"] = mk.tar_bytes(parts(te=tensors(
        [(T1, S1, [5], [3], 0), (T2, S1, [5], [1], 5)])))
    out["tar_pid_unknown.pth"] = mk.tar_bytes(parts(
        main=main_pickle({"a": Ref(T1), "b": Ref(T2 + 1)})))

    # a storage type that is os.system: refused as the global it is
    hdr = dump((S1, "cpu", T.FloatStorage)).replace(b"ctorch\nFloatStorage\n", b"cos\nsystem\n")
    out["tar_storage_type_os_system.pth"] = mk.tar_bytes(parts(st=storages(
        [(S1, "cpu", hdr, [float(i) for i in range(10)])])))

    # 'pickle' is a symbolic link (tarfile would follow it out of the archive)
    ps = parts()
    ents = [(header(n.encode(), len(d)), d) for n, d in ps if n != "pickle"]
    ents.insert(1, (_symlink(b"pickle", b"/etc/passwd"), b""))
    out["tar_member_symlink.pth"] = raw_tar(ents)

    # a PAX header lies about the size of 'storages': past the end
    ents = [(header(n.encode(), len(d)), d) for n, d in ps[:3]]
    rec = b"size=99999999"
    rec = b"%d %s\n" % (len(rec) + 4, rec)
    ents.append((header(b"././@PaxHeader", len(rec), b"x"), rec))
    ents.append((header(b"storages", len(ps[3][1])), ps[3][1]))
    out["tar_pax_size_lies.pth"] = raw_tar(ents)

    # a PAX record whose length runs past its header: tarfile takes the
    # archive as ending there, so 'storages' is missing
    rec = b"200 path=storages\n"
    ents = [(header(n.encode(), len(d)), d) for n, d in ps[:3]]
    ents.append((header(b"././@PaxHeader", len(rec), b"x"), rec))
    ents.append((header(b"storages", len(ps[3][1])), ps[3][1]))
    out["tar_pax_record_lies.pth"] = raw_tar(ents)

    # a GNU long name whose length runs past the end of the file
    ents = [(header(b"sys_info", len(SYS)), SYS)]
    b = raw_tar(ents)[:-1024] + header(b"././@LongLink", 1 << 30, b"L") + b"storages\0"
    out["tar_longname_truncated.pth"] = b
    return out


def _symlink(name, target):
    h = bytearray(header(name, 0, b"2"))
    h[157:157 + len(target)] = target
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else "."
    for name, data in files().items():
        with open(os.path.join(outdir, name), "wb") as f:
            f.write(data)
        print("wrote", os.path.join(outdir, name), len(data))


if __name__ == "__main__":
    main()
