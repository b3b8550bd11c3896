#!/usr/bin/env python3
"""Rewrite a checkpoint with thousands of storages (many memo entries, key
strings "0".."N", views and tied tensors among them) and check with torch
that every tensor comes back equal and shared as before."""
import os
import subprocess
import sys
import tempfile

try:
    import torch
except ImportError:
    print("no torch: skipped")
    sys.exit(77)

CKPT = os.environ.get("CKPT", "./ckpt")


def main():
    torch.manual_seed(0)
    sd = {}
    for i in range(3000):
        sd["module.block%d.weight" % i] = torch.randn(i % 7 + 1, i % 5 + 1)
    base = torch.arange(100.0)
    for i in range(50):  # views of one storage at many offsets
        sd["module.view%d" % i] = base[i:i + 10]
    sd["module.tied_a"] = sd["module.tied_b"] = torch.ones(3)
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        src, out = os.path.join(tmp, "many.pth"), os.path.join(tmp, "out.pth")
        torch.save(sd, src)
        run = subprocess.run([CKPT, "strip-module", "--quiet", src, out])
        if run.returncode != 0:
            print("FAIL strip-module exited %d" % run.returncode)
            print("0 passed, 1 failed")
            return 1
        got = torch.load(out, weights_only=True)
        for k, v in sd.items():
            g = got.get(k[len("module."):])
            if g is None or not torch.equal(g, v) or g.stride() != v.stride() \
                    or g.storage_offset() != v.storage_offset():
                failed += 1
                if failed < 5:
                    print("FAIL", k)
        views = {got["view%d" % i].storage().data_ptr() for i in range(50)}
        if len(views) != 1:
            failed += 1
            print("FAIL the views no longer share one storage")
        if got["tied_a"] is not got["tied_b"]:
            failed += 1
            print("FAIL tied tensors are no longer one object")
    passed = len(sd) + 2 - failed
    if not failed:
        print("ok %d tensors" % len(sd))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


sys.exit(main())
