#!/usr/bin/env python3
"""Compare ckpt's dtype casts (lib/core/element.c, driven through the cast_tool test
program named by $CAST_TOOL) bit for bit with torch's .double(), .float(),
.half() and .bfloat16() on CPU tensors: special values, every float16 and
bfloat16 bit pattern, float32 values around every float16 and bfloat16
rounding boundary, float64 values that round differently through float32,
and random bit patterns.  Long tensors take torch's vectorised kernels;
each special value is also cast alone, as a tensor of length 1.  With $CKPT
set, the same tensors also go through `ckpt convert --dtype`."""
import os
import sys
import tempfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exit 77 without torch)

c.need("numpy")
import numpy as np  # noqa: E402
import torch  # noqa: E402

CAST_TOOL = c.CAST_TOOL
CKPT = c.CKPT if os.environ.get("CKPT") else ""  # also checks `ckpt convert --dtype` when set

DTYPES = {  # name: (torch dtype, unsigned numpy type of the bits, signed one, method)
    "float64": (torch.float64, np.uint64, np.int64, "double"),
    "float32": (torch.float32, np.uint32, np.int32, "float"),
    "float16": (torch.float16, np.uint16, np.int16, "half"),
    "bfloat16": (torch.bfloat16, np.uint16, np.int16, "bfloat16"),
}
# torch 2.x: the float8 types, cast element-wise by .to() (no method)
for _n in ("float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _n):
        DTYPES[_n] = (getattr(torch, _n), np.uint8, np.int8, None)


def to_tensor(name, bits):
    _, ut, st, _ = DTYPES[name]
    a = np.ascontiguousarray(np.asarray(bits, dtype=ut)).view(st)
    return torch.from_numpy(a).view(DTYPES[name][0])


def to_bits(name, t):
    _, ut, st, _ = DTYPES[name]
    return t.contiguous().reshape(-1).view(DTYPES[name][0]).view(
        {np.int8: torch.int8, np.int16: torch.int16, np.int32: torch.int32,
         np.int64: torch.int64}[st]
    ).numpy().view(ut)


def is_nan(name, bits):
    b = np.asarray(bits, dtype=DTYPES[name][1])
    if name == "float64":
        return (b & np.uint64(0x7FFFFFFFFFFFFFFF)) > np.uint64(0x7FF0000000000000)
    if name == "float32":
        return (b & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if name == "float16":
        return (b & np.uint16(0x7FFF)) > np.uint16(0x7C00)
    if name == "float8_e4m3fn":
        return (b & np.uint8(0x7F)) == np.uint8(0x7F)
    if name == "float8_e5m2":
        return (b & np.uint8(0x7F)) > np.uint8(0x7C)
    return (b & np.uint16(0x7FFF)) > np.uint16(0x7F80)


# ---- inputs ------------------------------------------------------------------

def f32_specials():
    v = [0x00000000, 0x80000000, 0x7F800000, 0xFF800000,           # zeros, infs
         0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001,           # NaNs: quiet, signalling
         0x7FA00000, 0x7FFFFFFF, 0xFFFFFFFF, 0x7F812345, 0x7FC12345,
         0x7F80FFFF, 0x7F810000, 0x7F808000, 0xFF808001,
         0x7F7FFFFF, 0xFF7FFFFF, 0x00800000, 0x00000001, 0x807FFFFF,  # float32 extremes
         0x3F800000, 0xBF800000,
         0x477FE000, 0x477FEFFF, 0x477FF000, 0x477FF001, 0x47800000,  # float16 max, overflow tie
         0xC77FF000, 0x38800000, 0x387FFFFF, 0x387FF000, 0x387FE000,  # float16 min normal
         0x33800000, 0x33000000, 0x33000001, 0x32FFFFFF, 0x337FFFFF,  # float16 min subnormal, 2^-25
         0xB3000000, 0xB3000001, 0x33C00000, 0x33A00000, 0x34200000,
         0x7F7F8000, 0x7F7F7FFF, 0x7F7FFFFF, 0x7F7F0000, 0x7F7E8000,  # bfloat16 overflow tie
         0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF,              # bfloat16 ties to even
         0x3F801000, 0x3F800800, 0x3F801800, 0x3F803000]              # float16 ties to even
    return np.array(v, dtype=np.uint32)


def f64_specials():
    v = [0x0000000000000000, 0x8000000000000000, 0x7FF0000000000000, 0xFFF0000000000000,
         0x7FF8000000000000, 0xFFF8000000000000, 0x7FF0000000000001, 0xFFF0000012345678,
         0x7FF4000000000000, 0x7FF0000020000000, 0x7FF000001FFFFFFF, 0x7FFFFFFFFFFFFFFF,
         0x7FEFFFFFFFFFFFFF, 0x0010000000000000, 0x0000000000000001, 0x800FFFFFFFFFFFFF,
         0x47EFFFFFE0000000, 0x47EFFFFFEFFFFFFF, 0x47EFFFFFF0000000, 0x47EFFFFFF0000001,
         0xC7EFFFFFF0000000, 0x47F0000000000000,                        # float32 max, overflow tie
         0x3810000000000000, 0x380FFFFFFFFFFFFF, 0x380FFFFFF0000000,    # float32 min normal
         0x36A0000000000000, 0x3690000000000000, 0x3690000000000001,    # 2^-149, 2^-150 (tie)
         0x368FFFFFFFFFFFFF, 0x36A8000000000000, 0x36B4000000000000, 0xB690000000000001,
         0x3FF0000000000000, 0xBFF0000000000000,
         0x3FF0020000000000 + (1 << 12), 0x3FF0020000000000 - 1,      # half tie via float32
         0x3FF0100000000000 + 1, 0x3FF0300000000000 - 1, 0x3FF0300000000000 + 1,
         0x40EFFE0000000000 - 1, 0x40EFFE0000000000 + 1,                # 65520 -+ tiny
         0x3E70000000000000 + 1, 0x3E70000000000000 - 1,                # 2^-24 * 0.5 +- tiny
         0x47EFF00000000000 - 1, 0x47EFF00000000000 + 1]                # bf16 overflow tie
    return np.array(v, dtype=np.uint64)


def f32_inputs(rng):
    groups = {"specials": f32_specials()}
    all16 = np.arange(65536, dtype=np.uint16)
    groups["every float16"] = to_bits("float32", to_tensor("float16", all16).float())
    groups["every bfloat16"] = all16.astype(np.uint32) << np.uint32(16)
    # float16 rounding boundaries: the float32 half way between each
    # non-negative float16 and the next, and its neighbours, both signs
    h = np.arange(0x7C00, dtype=np.uint16)
    lo = to_bits("float32", to_tensor("float16", h).float()).astype(np.int64)
    hi = to_bits("float32", to_tensor("float16", h + np.uint16(1)).float()).astype(np.int64)
    mid = (to_tensor("float32", lo.astype(np.uint32)).double()
           + to_tensor("float32", hi.astype(np.uint32)).double()) / 2
    mid = to_bits("float32", mid.float()).astype(np.int64)  # exact: 11 bits of mantissa
    near = np.concatenate([mid + k for k in (-2, -1, 0, 1, 2)])
    near = near.astype(np.uint32)
    groups["float16 boundaries"] = np.concatenate([near, near | np.uint32(0x80000000)])
    # bfloat16 boundaries: each float32 with low half 0x8000, and neighbours
    b = (np.arange(65536, dtype=np.uint32) << np.uint32(16)) | np.uint32(0x8000)
    groups["bfloat16 boundaries"] = np.concatenate([b - np.uint32(2), b - np.uint32(1), b,
                                                    b + np.uint32(1), b + np.uint32(2)])
    groups["random bits"] = rng.integers(0, 2**32, size=1 << 20, dtype=np.uint64).astype(np.uint32)
    groups["random normal"] = to_bits("float32", torch.from_numpy(
        (rng.standard_normal(1 << 18) * 10.0 ** rng.integers(-12, 8, 1 << 18)).astype(np.float32)))
    return groups


def f64_inputs(rng, f32groups):
    groups = {"specials": f64_specials()}
    one = np.uint64(1)
    for k, v in f32groups.items():  # exact in float64
        groups["%s (float32 values)" % k] = to_bits("float64", to_tensor("float32", v).double())
    # double rounding: float64s just either side of the float32 boundaries of
    # float16 and bfloat16, and of float32's own, which float64 -> float32
    # sends to a tie and then to even, where one rounding might not
    ties = np.concatenate([f32groups["float16 boundaries"], f32groups["bfloat16 boundaries"]])
    ties = to_bits("float64", to_tensor("float32", ties).double()).astype(np.uint64)
    bump = np.uint64(1 << 12)
    groups["double rounding"] = np.concatenate([ties + one, ties - one, ties + bump, ties - bump])
    f = rng.integers(0, 2**32, size=1 << 18, dtype=np.uint64).astype(np.uint32)
    f = f[~is_nan("float32", f) & ((f & np.uint32(0x7FFFFFFF)) != np.uint32(0x7F800000))]
    d = to_bits("float64", to_tensor("float32", f).double())
    half_ulp = np.uint64(1 << 28)
    groups["float32 boundaries"] = np.concatenate([d + half_ulp - one, d + half_ulp, d + half_ulp + one,
                                                   d - half_ulp - one, d - half_ulp, d - half_ulp + one])
    # random: any bits, and float32-range exponents with random low bits
    groups["random bits"] = rng.integers(0, 2**64, size=1 << 19, dtype=np.uint64)
    e = rng.integers(1023 - 160, 1023 + 130, size=1 << 19, dtype=np.uint64)
    m = rng.integers(0, 2**52, size=1 << 19, dtype=np.uint64)
    s = rng.integers(0, 2, size=1 << 19, dtype=np.uint64)
    groups["random float32 range"] = (s << np.uint64(63)) | (e << np.uint64(52)) | m
    return groups


def all16_inputs():
    return {"every bit pattern": np.arange(65536, dtype=np.uint16)}


# ---- comparing ----------------------------------------------------------------

TORCH_1 = torch.__version__.split(".")[0] == "1"


def documented(src, dst, b, want, g):
    """Where torch's NaN differs from ckpt's as lib/core/element.c says:
    torch 1.13 drops a NaN's payload going to float16 (sign | 0x7e00, where
    ckpt and torch 2.x keep its top bits); torch 2.x's float16 -> float32
    gives 0x7fffffff for a NaN in a tensor's last n % 8 elements and in a
    0-dim one (ckpt, everywhere: its vectorised blocks' quiet NaN)."""
    nan = is_nan(src, b)
    if dst == "float16" and TORCH_1:
        return nan & (want == (g & np.uint16(0xFE00)))
    if src == "float16" and dst == "float32" and not TORCH_1:
        return nan & (want == np.uint32(0x7FFFFFFF))
    return np.zeros(len(b), dtype=bool)


def ckpt_cast(src, dst, bits):
    run = c.run([CAST_TOOL, src, dst], input=np.ascontiguousarray(bits).tobytes())
    if run.rc != 0:
        raise c.Fail("cast_tool %s %s exited %d: %s" % (src, dst, run.rc, run.err.strip()))
    return np.frombuffer(run.stdout, dtype=DTYPES[dst][1])


def torch_cast(src, dst, bits):
    t = to_tensor(src, bits)
    method = DTYPES[dst][3]
    return to_bits(dst, getattr(t, method)() if method else t.to(DTYPES[dst][0]))


def through_convert(t, inputs, tmp):
    """The same tensors through `ckpt convert --dtype` ($CKPT), as torch
    loads the result: one check per target dtype and format."""
    sd = {"%s/%s" % (src, g): to_tensor(src, bits).clone()
          for src, groups in inputs.items() for g, bits in groups.items()}
    path = c.save(sd, os.path.join(tmp, "in.pth"))

    def convert(dst, fmt):
        out = os.path.join(tmp, "out.pth")
        c.ckpt_expect(0, "convert", "--quiet", "--to", fmt, "--dtype", dst, path, out)
        got = torch.load(out)
        os.unlink(out)
        bad = []
        for k, v in sd.items():
            if k not in got or got[k].dtype != DTYPES[dst][0] or got[k].shape != v.shape:
                bad.append("%s: missing or %s, not %s" % (k, got[k].dtype if k in got else "-", dst))
                continue
            src = k.split("/")[0]
            want, g = torch_cast(src, dst, to_bits(src, v)), to_bits(dst, got[k])
            diff = want != g
            if dst == "bfloat16" and k.startswith("float64/"):  # as in compare()
                diff &= ~(is_nan("float64", to_bits("float64", v)) & (want == 0x7FC0) & (g == 0xFFFF))
            diff &= ~documented(src, dst, to_bits(src, v), want, g)
            if diff.any():
                bad.append("%s: %d elements differ" % (k, int(diff.sum())))
        return bad

    for dst in ("float16", "bfloat16", "float32"):
        for fmt in ("pth", "pth-legacy"):
            t.run("ckpt convert --to %s --dtype %s" % (fmt, dst), convert, dst, fmt)
    for dst in DTYPES:  # torch 2.x: float8 outputs (pth-legacy cannot hold them)
        if dst.startswith("float8"):
            t.run("ckpt convert --to pth --dtype %s" % dst, convert, dst, "pth")


def compare(src, dst, bits, vector_bf16, tolerated, alone=False):
    """The cast of BITS from SRC to DST by cast_tool against torch's: as one
    long tensor (BITS repeated to 1000 elements or more), and with ALONE
    each element also as a tensor of its own.  What differs, as a list."""
    got = ckpt_cast(src, dst, bits)
    checks = [("long", bits if len(bits) >= 1000 else np.tile(bits, -(-1000 // len(bits))))]
    if alone:
        checks.append(("length 1", bits))
    errs = []
    for how, b in checks:
        g = got if len(b) == len(bits) else np.tile(got, len(b) // len(bits))
        if how == "length 1":
            want = np.concatenate([torch_cast(src, dst, b[i:i + 1]) for i in range(len(b))])
        else:
            want = torch_cast(src, dst, b)
        diff = want != g
        if dst == "bfloat16" and (src == "float64" or (src == "float32" and not vector_bf16)):
            # torch's scalar kernel gives a bfloat16 NaN 0x7fc0 where its
            # vectorised one (and ckpt) give 0xffff: float64 tails of
            # fewer than 16 (AVX2) / 32 (AVX-512) elements, and all
            # NaNs without AVX2
            ok = diff & is_nan(src, b) & (want == 0x7FC0) & (g == 0xFFFF)
            if ok.any():
                key = "%s -> %s (%s): torch's scalar path gives 0x7fc0, ckpt 0xffff" % (src, dst, how)
                tolerated[key] = tolerated.get(key, 0) + int(ok.sum())
            diff &= ~ok
        ok = diff & documented(src, dst, b, want, g)
        if ok.any():
            key = "%s -> %s (%s): NaN as torch %s gives it" % (src, dst, how, torch.__version__)
            tolerated[key] = tolerated.get(key, 0) + int(ok.sum())
        diff &= ~ok
        if diff.any():
            errs.append("%s: %d of %d elements differ, e.g. %s" % (
                how, int(diff.sum()), len(b), ", ".join(
                    "in %#x torch %#x ckpt %#x" % (int(b[i]), int(want[i]), int(g[i]))
                    for i in np.flatnonzero(diff)[:5])))
    return errs


def main():
    t = c.Tally(uses="cast_tool %s, ckpt %s" % (CAST_TOOL, CKPT or "(CKPT not set: convert not run)"))
    t.need(CAST_TOOL, "CAST_TOOL")
    if CKPT:
        t.need(CKPT, "CKPT")
    rng = np.random.default_rng(20240513)
    inputs = {"float32": f32_inputs(rng)}
    inputs["float64"] = f64_inputs(rng, inputs["float32"])
    inputs["float16"] = all16_inputs()
    inputs["bfloat16"] = all16_inputs()
    for name in DTYPES:
        if name.startswith("float8"):
            inputs[name] = {"every bit pattern": np.arange(256, dtype=np.uint8)}
    inputs["float16"]["specials"] = np.array([0, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7C01, 0xFC01,
                                              0x7D23, 0x7FFF, 0xFFFF, 0x7BFF, 0x0001, 0x03FF, 0x0400,
                                              0x3C00, 0x3C01], dtype=np.uint16)
    inputs["bfloat16"]["specials"] = np.array([0, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x7F81, 0xFF81,
                                               0x7FA3, 0x7FFF, 0xFFFF, 0x7F7F, 0x0001, 0x007F, 0x0080,
                                               0x3F80, 0x3F81, 0x477F, 0x4780, 0x3380, 0x3300],
                                              dtype=np.uint16)
    # with AVX2 / AVX-512 kernels even a single float32 NaN takes the vector path
    vector_bf16 = torch_cast("float32", "bfloat16", np.array([0x7FC00000], dtype=np.uint32))[0] == 0xFFFF
    if not vector_bf16:
        print("note torch %s has no vectorised float32 -> bfloat16 here (CPU capability %s)"
              % (torch.__version__, os.environ.get("ATEN_CPU_CAPABILITY", "?")))
    tolerated = {}
    for src, groups in inputs.items():
        for dst in DTYPES:
            for gname, bits in groups.items():
                t.run("%s -> %s, %s" % (src, dst, gname), compare, src, dst, bits,
                      vector_bf16, tolerated, gname == "specials")
    if CKPT:
        with tempfile.TemporaryDirectory(prefix="ckpt-cast-") as tmp:
            through_convert(t, inputs, tmp)
    for k, v in sorted(tolerated.items()):
        print("note %s: %d NaNs" % (k, v))
    return t.summary()


sys.exit(main())
