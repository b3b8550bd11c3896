#!/usr/bin/env python3
"""Rewrite a checkpoint with thousands of storages (many memo entries, key
strings "0".."N", views and tied tensors among them) and check with torch
that every tensor comes back equal and shared as before.

One check per tensor (value, stride, offset; printed as one `ok N tensors`
line, failures one by one, the first four), then the views and the tied
pair; exits 1 if anything failed, 77 (skip) if torch cannot be imported."""
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exit 77 without torch)
import torch  # noqa: E402


def main():
    t = c.Tally()
    t.need(c.CKPT, 'CKPT')
    torch.manual_seed(0)
    sd = {}
    for i in range(3000):
        sd["module.block%d.weight" % i] = torch.randn(i % 7 + 1, i % 5 + 1)
    base = torch.arange(100.0)
    for i in range(50):  # views of one storage at many offsets
        sd["module.view%d" % i] = base[i:i + 10]
    sd["module.tied_a"] = sd["module.tied_b"] = torch.ones(3)
    src, out = c.scratch("many.pth"), c.scratch("out.pth")
    torch.save(sd, src)
    r = c.ckpt("strip-module", "--quiet", src, out)
    if r.rc != 0:
        t.fail("strip-module", "exited %d: %s" % (r.rc, r.err.strip()))
        return t.summary()
    try:
        got = torch.load(out, weights_only=True)
    except Exception as e:
        t.fail("torch.load of strip-module's output", c.describe(e))
        return t.summary()

    bad = []
    for k, v in sd.items():
        g = got.get(k[len("module."):])
        if g is None or not torch.equal(g, v) or g.stride() != v.stride() \
                or g.storage_offset() != v.storage_offset():
            bad.append(k)
    for k in bad[:4]:
        print("FAIL", k)
    t.add(len(sd) - len(bad), len(bad))
    if not bad:
        print("ok %d tensors" % len(sd))

    def views():
        ptrs = {got["view%d" % i].storage().data_ptr() for i in range(50)}
        return [] if len(ptrs) == 1 else ["the views no longer share one storage"]
    t.run("50 views of one storage share it", views)

    def tied():
        return [] if got["tied_a"] is got["tied_b"] else \
            ["tied tensors are no longer one object"]
    t.run("tied tensors are one object", tied)
    return t.summary()


sys.exit(main())
