"""ckpt_toolkit's API, function by function, on the repository's fixtures.

Each test is an example of use.  Tensors are compared with what `ckpt inspect
--json --stats` says of the same state dict (keys in order, dtypes, shapes,
the CRC-32 of each tensor's bytes) and, where torch is importable, with
torch.load bit for bit; the torch parts are skipped in a numpy-only venv.
Run by tests/python/run.sh (under each Python make check knows).
"""

import argparse
import collections
import glob
import io
import os
import json
import re
import textwrap
import threading
import time
import shutil
import subprocess
import sys
import zlib

import numpy as np
import pytest

import ckpt_toolkit as ck
from ckpt_toolkit import CheckpointError

try:
    import torch
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not importable here")
TORCH2 = torch is not None and int(torch.__version__.split(".")[0]) >= 2
DATA = "tests/data"
DIST = "tests/fixtures/distributed"

# every input kind ckpt reads, each with the state dict safe_open takes
INPUTS = [
    f"{DATA}/mlp.pth",                        # pth-zip, saved on cuda:0
    f"{DATA}/deflated.pth",                   # compressed records: read, not mapped
    f"{DATA}/legacy_mlp.pth",                 # pre-1.6 legacy
    f"{DATA}/proto4.pth",
    f"{DATA}/dtypes.pth",                     # every classic dtype, views, tied tensors
    f"{DATA}/train_ckpt.pth",                 # a training checkpoint: its model's state dict
    f"{DATA}/lightning.pth",
    f"{DATA}/tar/tar_state_dict.pth",         # torch 0.1's tar
    f"{DATA}/tar/tar_shared_view.pth",
    f"{DATA}/quirks/legacy_views.pth",        # PyTorch 0.3 storage views
    f"{DATA}/torch2/whole_mlp.pt",            # a whole pickled model: its state dict
    f"{DATA}/torch2/bigendian.pth",           # saved big-endian: read swapped
    f"{DATA}/torch2/dtypes_v3.pth",           # torch 2.x's newer dtypes
    f"{DATA}/hf/gpt2_st_sharded/model-00001-of-00004.safetensors",
    f"{DATA}/hf/gpt2_st_sharded",             # a model folder: a sharded safetensors set
    f"{DATA}/hf/gpt2_bin_sharded/pytorch_model.bin.index.json",
    f"{DIST}/dcp/plain1",                     # torch.distributed.checkpoint folder
    f"{DIST}/dcp/zstd",                       # zstd-compressed DCP items (select below)
    f"{DIST}/deepspeed/zero1_fp32_2",         # DeepSpeed ZeRO folder
    f"{DIST}/deepspeed/zero2_bf16_4",         # ... its frozen bf16 parameters upcast
]
SELECT = {f"{DIST}/dcp/zstd": "model"}


def run_ckpt(*args):
    p = subprocess.run([ck.ckpt_path(), *args], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, check=False)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def extracted_stats(path, tmp_path, select=None):
    """`ckpt inspect --json --stats` of the state dict `ckpt extract` writes."""
    out = tmp_path / "sd.pth"
    opts = {"select": select} if select else {}
    ck.extract(path, out=out, map_location="cpu", **opts)
    rc, doc, err = run_ckpt("inspect", "--json", "--stats", str(out))
    assert rc == 0, err
    return json.loads(doc)["tensors"]


def raw_bytes(t):
    """A tensor's (or array's) C-contiguous bytes."""
    if isinstance(t, np.ndarray):
        return np.ascontiguousarray(t).tobytes()
    t = t.detach().cpu().contiguous()
    if t.dim() == 0:
        t = t.reshape(1)
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def np_or_none(f, key):
    """framework='np' gives every dtype numpy has (with ml_dtypes: bfloat16,
    float8); the others raise CheckpointError naming the way out."""
    try:
        return f.get_tensor(key)
    except CheckpointError as e:
        assert "ml_dtypes" in e.message or "framework='pt'" in e.message, e.message
        return None


@pytest.mark.parametrize("path", INPUTS)
def test_load_np_matches_inspect(path, tmp_path):
    """load()/safe_open(framework='np'): the keys, dtypes, shapes and bytes that
    ckpt inspect --stats reports for the same state dict."""
    want = extracted_stats(path, tmp_path, SELECT.get(path))
    with ck.safe_open(path, framework="np", select=SELECT.get(path)) as f:
        assert f.keys() == [t["path"][0] for t in want]
        for t in want:
            sl = f.get_slice(t["path"][0])
            assert sl.get_shape() == t["shape"]
            a = np_or_none(f, t["path"][0])
            if a is None:
                continue
            assert list(a.shape) == t["shape"]
            assert zlib.crc32(np.ascontiguousarray(a).tobytes()) == int(t["crc32"], 16), t["path"]


@needs_torch
@pytest.mark.parametrize("path", INPUTS)
def test_load_pt_matches_inspect(path, tmp_path):
    """load(framework='pt'): the same, as torch tensors of ckpt's dtypes."""
    want = extracted_stats(path, tmp_path, SELECT.get(path))
    try:
        sd = ck.load(path, select=SELECT.get(path))
    except CheckpointError as e:  # torch 1.13 lacks uint16, float8, ...
        assert not TORCH2 and "is not a dtype of torch" in e.message, e.message
        return
    assert list(sd) == [t["path"][0] for t in want]
    for t in want:
        x = sd[t["path"][0]]
        assert str(x.dtype) == "torch." + t["dtype"] and list(x.shape) == t["shape"]
        assert zlib.crc32(raw_bytes(x)) == int(t["crc32"], 16), t["path"]


def test_zero_copy_views():
    """An uncompressed pth-zip: tensors are views of the mapped file, writable
    (copy on write: the file never changes), one mapping for the handle."""
    path = f"{DATA}/dtypes.pth"
    before = open(path, "rb").read()
    with ck.safe_open(path, framework="np") as f:
        a, b = f.get_tensor("tied_a"), f.get_tensor("tied_b")
        base, view = f.get_tensor("base"), f.get_tensor("offset_view")
        assert len(f._file._maps) == 1
    assert np.shares_memory(a, b)                     # one storage, as in the file
    assert np.shares_memory(base, view) and (view == base[5:12]).all()
    assert a.flags.writeable and not a.flags.owndata  # a view, not a copy
    a[0, 0] = 12345.0
    assert b[0, 0] == 12345.0
    assert open(path, "rb").read() == before


def test_read_on_demand():
    """A compressed record cannot be mapped: read when asked for, checked."""
    with ck.safe_open(f"{DATA}/deflated.pth", framework="np") as f:
        assert f._file._storages == {}                # nothing read by opening
        w = f.get_tensor("n.1.weight")
        assert w.flags.owndata or w.base is not None
        assert len(f._file._storages) == 1


def cached_pages(path):
    """mincore() of PATH mapped: one flag a page, true where it is cached."""
    import ctypes
    import mmap
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) as mm:
        pages = (len(mm) + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = ctypes.create_string_buffer(pages)
        buf = ctypes.c_char.from_buffer(mm)
        try:
            if libc.mincore(ctypes.addressof(buf), len(mm), vec) != 0:
                pytest.skip("mincore: %s" % os.strerror(ctypes.get_errno()))
            return [b & 1 for b in vec.raw]
        finally:
            del buf


def test_load_reads_ahead_what_is_not_cached(tmp_path, monkeypatch):
    """load() has the kernel read the storages that are not in the page cache, in
    file order, from a thread: here 'b' then 'a' (keys sort the other way), and
    not the small 'c'.  Once they are cached, nothing is asked."""
    from ckpt_toolkit import _file
    sizes = {"a": 3 << 19, "b": 2 << 20, "c": 16}
    order, at, header = ["b", "a", "c"], 0, {}
    for k in order:
        header[k] = {"dtype": "U8", "shape": [sizes[k]], "data_offsets": [at, at + sizes[k]]}
        at += sizes[k]
    raw = json.dumps(header, sort_keys=True).encode()
    raw += b" " * (-len(raw) % 8)
    path = tmp_path / "cold.safetensors"
    with open(path, "wb") as out:
        out.write(len(raw).to_bytes(8, "little") + raw)
        for k in order:
            out.write(bytes([ord(k)]) * sizes[k])
        out.flush()
        os.fsync(out.fileno())
    # The whole file out of the page cache, as mincore() sees it (no read: a
    # probe that reads, as load()'s own, may start the disk's read-ahead, 8 MiB
    # on this VM's disk).  DONTNEED may leave a page it finds busy: a few
    # tries (with one try, b's end was once still cached and b not asked).
    fd = os.open(path, os.O_RDONLY)
    for _ in range(5):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        cold = not any(cached_pages(path))
        if cold:
            break
        time.sleep(0.05)
    os.close(fd)
    if not cold:
        pytest.skip("the page cache of this file system cannot be dropped (tmpfs?)")
    asked = []

    def will_need(fd, ranges):
        asked.append(ranges)
        os.close(fd)
    monkeypatch.setattr(_file, "_will_need", will_need)
    for again in (False, True):
        tensors = ck.load(path, framework="np")
        for t in threading.enumerate():
            if t.name == "ckpt_toolkit read-ahead":
                t.join()
        assert {k: (v.size, int(v[0])) for k, v in tensors.items()} == \
            {k: (n, ord(k)) for k, n in sizes.items()}
        base = 8 + len(raw)
        assert asked == [[(base, 2 << 20), (base + (2 << 20), 3 << 19)]]  # once
        del tensors
        with open(path, "rb") as fh:  # now in the page cache
            fh.read()


def test_record_headers_checked_at_first_read():
    """Opening reads the index and the pickle only; a record torch would refuse
    to read (its local header zeroed) fails when its tensor is read, as ckpt
    inspect fails at open, and never earlier."""
    bad = "tests/bad/local_header_zeroed.pth"
    rc, _, err = run_ckpt("inspect", bad)
    with ck.safe_open(bad, framework="np") as f:
        assert f.keys() == ["w", "b"]
        assert f.get_tensor("b").tolist() == [0.0, 0.25, 0.5]
        with pytest.raises(CheckpointError) as e:
            f.get_tensor("w")
    assert (e.value.exit_status, f"ckpt: inspect: {bad}: {e.value.message}\n") == (rc, err)
    assert "record 'archive/data/0' has no local header" in e.value.message
    with pytest.raises(CheckpointError, match="has no local header"):
        ck.load(bad, framework="np")
    if torch is not None:
        with pytest.raises(CheckpointError, match="has no local header"):
            ck.torch_load(bad)


@pytest.mark.parametrize("path", [f"{DATA}/mlp.pth", f"{DATA}/deflated.pth",
                                  f"{DIST}/dcp/plain1"])
def test_get_slice(path):
    """get_slice reads the rows it needs (a compressed or DCP storage: only those
    bytes; a mapped one: a view), and slices as numpy does."""
    with ck.safe_open(path, framework="np") as f:
        for key in f.keys():
            full = f.get_tensor(key)
            s = f.get_slice(key)
            assert s.get_shape() == list(full.shape)
            assert s.get_dtype() in ("F32", "F64", "I64", "BF16", "F16")
            for index in [(slice(None),), (slice(1, 3),), (0,), (-1,), (slice(0, None, 2),),
                          (slice(5, 2),), (Ellipsis,)]:
                if full.ndim == 0 and index != (Ellipsis,):
                    continue
                assert np.array_equal(s[index], full[index]), (key, index)
            if full.ndim == 2:
                assert np.array_equal(s[1:3, 2:4], full[1:3, 2:4])


def test_metadata():
    """metadata(): a safetensors file's __metadata__; for the rest, what was read."""
    with ck.safe_open(f"{DATA}/hf/gpt2_st_sharded/model-00001-of-00004.safetensors",
                      framework="np") as f:
        assert f.metadata() == {"format": "pt"}
    with ck.safe_open(f"{DATA}/train_ckpt.pth", framework="np") as f:
        assert f.metadata() == {"format": "pth-zip", "state_dict": "model_state_dict",
                                "source": "mapping"}
    with ck.safe_open(f"{DATA}/torch2/whole_mlp.pt", framework="np") as f:
        md = f.metadata()
        assert md["source"] == "module-tree" and md["class"].endswith("Sequential"), md


def test_select():
    """select= names the state dict ("a/b"); without it, a file with several
    model state dicts is refused as ckpt extract refuses it (exit status 2)."""
    path = f"{DIST}/dcp/fsdp2_2"
    with pytest.raises(CheckpointError) as e:
        ck.safe_open(path, framework="np")
    assert e.value.exit_status == 2 and "--select" in e.value.message
    with ck.safe_open(path, framework="np", select="model") as f:
        assert f.metadata()["state_dict"] == "model" and len(f.keys()) == 8
    with pytest.raises(CheckpointError) as e:
        ck.load(path, framework="np", select="nothing/here")
    assert e.value.exit_status == 3


def test_errors():
    """Every failure is a CheckpointError with ckpt's exit status and message."""
    with pytest.raises(CheckpointError) as e:
        ck.load("tests/data/no-such-file.pth", framework="np")
    assert e.value.exit_status == 4 and "No such file" in e.value.message
    rc, _, err = run_ckpt("inspect", "tests/bad/empty.pth")
    with pytest.raises(CheckpointError) as e:
        ck.load("tests/bad/empty.pth", framework="np")
    assert (e.value.exit_status, f"ckpt: inspect: tests/bad/empty.pth: {e.value.message}\n") \
        == (rc, err)
    with pytest.raises(CheckpointError) as e:
        ck.safe_open(f"{DATA}/mlp.pth", framework="np").get_tensor("nope")
    assert e.value.exit_status == 2
    with pytest.raises(CheckpointError):
        ck.safe_open(f"{DATA}/mlp.pth", framework="np", device="cuda:0")
    f = ck.safe_open(f"{DATA}/mlp.pth", framework="np")
    assert len(f) == 4 and "n.1.bias" in f and list(f) == f.keys()
    f.close()
    with pytest.raises(CheckpointError, match="closed"):
        f.get_tensor("n.1.bias")


def test_unsafe_file_is_refused_unread():
    """A pickle that would run code is refused, never run (exit status 3)."""
    with pytest.raises(CheckpointError) as e:
        ck.load("tests/bad/builtins_eval.pth", framework="np")
    assert e.value.exit_status == 3 and "builtins.eval" in e.value.message


@pytest.mark.skipif(torch is not None, reason="torch is importable here")
def test_without_torch():
    """framework='pt' and torch_load need torch: without it, an error that says so."""
    with pytest.raises(CheckpointError, match="framework='np'") as e:
        ck.load(f"{DATA}/mlp.pth")
    assert e.value.exit_status == 2
    with pytest.raises(CheckpointError, match="needs torch"):
        ck.torch_load(f"{DATA}/mlp.pth")


def test_bfloat16_without_or_with_ml_dtypes():
    """framework='np' and bfloat16: ml_dtypes' dtype, or an error naming it."""
    with ck.safe_open(f"{DATA}/dtypes.pth", framework="np") as f:
        try:
            import ml_dtypes
        except ImportError:
            with pytest.raises(CheckpointError, match="ml_dtypes"):
                f.get_tensor("bfloat16")
        else:
            assert f.get_tensor("bfloat16").dtype == np.dtype(ml_dtypes.bfloat16)


def test_float8_through_ml_dtypes():
    """framework='np' and torch 2.x's float8 kinds: ml_dtypes' dtypes of those names,
    the same bytes as torch's tensors (or, without ml_dtypes, an error naming it)."""
    kinds = ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
             "float8_e8m0fnu"]
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        with ck.safe_open(f"{DATA}/torch2/dtypes_v3.pth", framework="np") as f:
            with pytest.raises(CheckpointError, match="ml_dtypes"):
                f.get_tensor("float8_e4m3fn")
        return
    want = torch.load(f"{DATA}/torch2/dtypes_v3.pth", weights_only=True) if TORCH2 else None
    with ck.safe_open(f"{DATA}/torch2/dtypes_v3.pth", framework="np") as f:
        for k in kinds:
            a = f.get_tensor(k)
            assert a.dtype.name == k, (k, a.dtype)
            if want is not None:
                assert a.tobytes() == want[k].view(torch.uint8).numpy().tobytes(), k


# ---- torch_load, against torch.load ----

TORCH_LOAD_FILES = [
    f"{DATA}/mlp.pth", f"{DATA}/dtypes.pth", f"{DATA}/train_ckpt.pth",
    f"{DATA}/legacy_train.pth", f"{DATA}/lightning.pth", f"{DATA}/keepvars.pth",
    f"{DATA}/deflated.pth", f"{DATA}/proto4.pth", f"{DATA}/bn.pth",
    f"{DATA}/tar/tar_training.pth", f"{DATA}/tar/tar_shared_view.pth",
    f"{DATA}/quirks/legacy_views.pth", f"{DATA}/torch2/shared_v3.pth",
    f"{DATA}/torch2/dtypes_v3.pth", f"{DATA}/torch2/dp_fp8.pth", f"{DATA}/torch2/nocrc.pth",
    f"{DATA}/crnn_tiny.ref.pth", f"{DIST}/dcp/edge.ref.pth",
    f"{DATA}/torch2/kinds.pth",  # quantized (quint4x2 too), sparse COO and CSR, meta
]


def torch_reference(path):
    """torch.load of a fixture the repository made (trusted: weights_only=False
    only where weights-only refuses it)."""
    kw = {"map_location": "cpu"}
    try:
        return torch.load(path, weights_only=True, **kw)
    except Exception:
        sys.path.insert(0, "tests/fixtures")
        try:
            return torch.load(path, weights_only=False, **kw)
        finally:
            sys.path.remove("tests/fixtures")


# Files with storage views (PyTorch 0.3's view_metadata, a tar's views): torch
# makes each view a storage of its own over the root's memory; ckpt_toolkit
# puts the tensor on the root storage, at the view's offset plus its own.
# Same memory, same values; storage_offset and the storage objects differ.
STORAGE_VIEWS = {f"{DATA}/tar/tar_shared_view.pth", f"{DATA}/quirks/legacy_views.pth"}


def same_object(a, b, path="root", offsets=True):
    """A and B are the same object tree: types, keys in order, _metadata, and
    tensors bit for bit (dtype, shape, stride, requires_grad, Parameter)."""
    if torch is not None and isinstance(b, torch.Tensor):
        assert type(a) is type(b), (path, type(a), type(b))
        if b.is_quantized:
            assert (a.dtype, a.qscheme(), a.shape, a.stride()) == \
                (b.dtype, b.qscheme(), b.shape, b.stride()), path
            if b.qscheme() == torch.per_tensor_affine:
                assert (a.q_scale(), a.q_zero_point()) == (b.q_scale(), b.q_zero_point()), path
            else:
                assert torch.equal(a.q_per_channel_scales(), b.q_per_channel_scales()), path
                assert torch.equal(a.q_per_channel_zero_points(),
                                   b.q_per_channel_zero_points()), path
            assert bytes(a.untyped_storage()) == bytes(b.untyped_storage()), path
            return
        if b.layout != torch.strided:
            assert (a.layout, a.dtype, a.shape) == (b.layout, b.dtype, b.shape), path
            assert raw_bytes(a.to_dense()) == raw_bytes(b.to_dense()), path
            return
        if b.device.type == "meta":
            assert (a.device, a.dtype, a.shape, a.stride()) == \
                (b.device, b.dtype, b.shape, b.stride()), path
            return
        assert (a.dtype, a.shape, a.stride(), a.requires_grad) == \
            (b.dtype, b.shape, b.stride(), b.requires_grad), path
        assert not offsets or a.storage_offset() == b.storage_offset(), path
        assert raw_bytes(a) == raw_bytes(b), path
        return
    assert type(a) is type(b), (path, type(a), type(b))
    if isinstance(b, dict):
        assert list(a) == list(b), path
        assert getattr(a, "_metadata", None) == getattr(b, "_metadata", None), path
        for k in b:
            same_object(a[k], b[k], f"{path}/{k}", offsets)
    elif isinstance(b, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            same_object(x, y, f"{path}/{i}", offsets)
    elif isinstance(b, argparse.Namespace):
        same_object(vars(a), vars(b), path, offsets)
    elif isinstance(b, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), path
    elif isinstance(b, float) and b != b:
        assert a != a, path
    else:
        assert a == b, (path, a, b)


def storages_shared(obj):
    """{data_ptr: [tensors]} of the tensors in OBJ, to compare sharing."""
    out = collections.defaultdict(list)

    def walk(o, p):
        if isinstance(o, torch.Tensor):
            if not o.is_quantized and o.device.type != "meta" and o.layout == torch.strided:
                ptr = (o.untyped_storage() if hasattr(o, "untyped_storage")
                       else o.storage()).data_ptr()
                out[ptr].append(p)
        elif isinstance(o, dict):
            for k, v in o.items():
                walk(v, f"{p}/{k}")
        elif isinstance(o, (list, tuple)):
            for i, v in enumerate(o):
                walk(v, f"{p}/{i}")
    walk(obj, "")
    return sorted(sorted(v) for v in out.values())


@needs_torch
@pytest.mark.parametrize("path", TORCH_LOAD_FILES)
def test_torch_load_is_torch_load(path):
    """torch_load returns torch.load's object: same tree, same tensors bit for bit,
    the same tensors sharing storages."""
    try:
        want = torch_reference(path)
    except Exception as e:  # this torch cannot read it (1.13: newer dtypes)
        print(f"torch {torch.__version__} cannot load {path}: {type(e).__name__}")
        try:
            ck.torch_load(path, map_location="cpu")
        except CheckpointError as ours:
            print(f"torch_load: {ours}")
        return
    got = ck.torch_load(path, map_location="cpu")
    same_object(got, want, offsets=path not in STORAGE_VIEWS)
    if path not in STORAGE_VIEWS:
        assert storages_shared(got) == storages_shared(want)


@needs_torch
def test_torch_load_where_weights_only_refuses():
    """train_ckpt.pth holds an argparse.Namespace: plain weights-only torch.load
    refuses it; torch_load builds it (nothing imported from the file)."""
    path = f"{DATA}/train_ckpt.pth"
    with pytest.raises(Exception):
        torch.load(path, weights_only=True, map_location="cpu")
    ckpt = ck.torch_load(path, map_location="cpu")
    assert ckpt["args"] == argparse.Namespace(lr=0.01, batch_size=64, name="mlp")
    assert isinstance(ckpt["model_state_dict"], collections.OrderedDict)


@needs_torch
def test_torch_load_whole_model_is_its_state_dict():
    """A whole pickled model: its state dict (model.state_dict()'s keys, order,
    _metadata, detached tensors), its class never imported."""
    path = f"{DATA}/torch2/whole_mlp.pt"
    got = ck.torch_load(path)
    assert isinstance(got, collections.OrderedDict)
    if TORCH2:
        want = torch.load(path, weights_only=False).state_dict()
        same_object(got, want)


@needs_torch
def test_torch_load_map_location_and_file_objects(tmp_path):
    """map_location as torch takes it; file objects, with a name or in memory."""
    path = f"{DATA}/mlp.pth"                 # saved on cuda:0
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA") as e:
            ck.torch_load(path)              # as torch.load raises
        assert isinstance(e.value, CheckpointError) and e.value.exit_status == 4
        with pytest.raises(CheckpointError, match="CUDA"):
            ck.safe_open(path, device="cuda:0")
    else:
        t = ck.load(path, device="cuda:0")["n.1.weight"]
        assert t.device == torch.device("cuda:0")
        assert ck.torch_load(path)["n.1.weight"].device == torch.device("cuda:0")
    for ml in ("cpu", torch.device("cpu"), {"cuda:0": "cpu"}):
        sd = ck.torch_load(path, map_location=ml)
        assert all(t.device.type == "cpu" for t in sd.values())
    with open(path, "rb") as fh:
        a = ck.torch_load(fh, map_location="cpu")
    b = ck.torch_load(io.BytesIO(open(path, "rb").read()), map_location="cpu")
    same_object(a, b)


# ---- the commands ----

def test_inspect_is_ckpt_inspect():
    """inspect(): ckpt inspect --json's document."""
    doc = ck.inspect(f"{DATA}/mlp.pth")
    rc, out, _ = run_ckpt("inspect", "--json", f"{DATA}/mlp.pth")
    assert rc == 0 and doc == json.loads(out)
    assert [t["path"] for t in doc["tensors"]][0] == ["n.1.weight"]
    with pytest.raises(CheckpointError) as e:
        ck.inspect("tests/bad/empty.pth")
    assert (e.value.exit_status, e.value.message, e.value.file) == \
        (3, "empty file", "tests/bad/empty.pth")


def test_scan_verdicts():
    """scan(): the document, also for an unsafe file (its exit is 1); check=True
    raises on that verdict."""
    safe = ck.scan(f"{DATA}/mlp.pth")
    assert safe["exit"] == 0
    bad = ck.scan("tests/bad/builtins_eval.pth", f"{DATA}/mlp.pth")
    assert bad["exit"] == 1 and bad["summary"]["files"] == 2
    with pytest.raises(CheckpointError) as e:
        ck.scan("tests/bad/builtins_eval.pth", check=True)
    assert e.value.exit_status == 1 and e.value.document["exit"] == 1


def test_diff_and_rewrites(tmp_path):
    """strip_module, add_module, unwrap, rename, remap, extract, convert, with
    out= and in_place=; diff() compares the results."""
    dp = f"{DATA}/dp_mlp.pth"
    plain = tmp_path / "plain.pth"
    r = ck.strip_module(dp, out=plain, map_location="cpu")
    assert r["output"] == str(plain) and any(ln.startswith("wrote") for ln in r["lines"])
    assert ck.load(plain, framework="np").keys() == \
        {k[len("module."):] for k in ck.load(dp, framework="np")}
    d = ck.diff(dp, plain, normalize=True)
    assert d["equal"] is True
    d = ck.diff(dp, plain)                       # keys differ: a verdict, not an error
    assert d["equal"] is False
    with pytest.raises(CheckpointError) as e:
        ck.diff(dp, plain, check=True)
    assert e.value.exit_status == 1

    copy = tmp_path / "copy.pth"
    shutil.copy(plain, copy)
    ck.add_module(copy, in_place=True)
    assert sorted(ck.load(copy, framework="np")) == sorted(ck.load(dp, framework="np"))
    ck.unwrap(copy, in_place=True)
    ck.rename(copy, in_place=True, e=[r"s/^n\./net./"])
    assert sorted(ck.load(copy, framework="np")) == ["net.1.bias", "net.1.weight",
                                                     "net.3.bias", "net.3.weight"]
    ck.remap(f"{DATA}/mlp.pth", out=tmp_path / "cpu.pth", to="cpu")
    assert {t["device"] for t in ck.inspect(tmp_path / "cpu.pth")["tensors"]} == {"cpu"}
    ck.extract(f"{DATA}/train_ckpt.pth", out=tmp_path / "model.pth")
    st = tmp_path / "model.safetensors"
    ck.convert(tmp_path / "model.pth", out=st)
    a, b = ck.load(tmp_path / "model.pth", framework="np"), ck.load(st, framework="np")
    assert list(a) == list(b) and all(np.array_equal(a[k], b[k]) for k in a)
    dry = ck.strip_module(dp, out=tmp_path / "x.pth", dry_run=True)
    assert "module.n.1.weight -> n.1.weight" in dry["lines"] and not (tmp_path / "x.pth").exists()
    with pytest.raises(CheckpointError) as e:
        ck.extract("tests/bad/empty.pth", out=tmp_path / "y.pth")
    assert (e.value.exit_status, e.value.message) == (3, "empty file")
    with pytest.raises(CheckpointError) as e:
        ck.rename(dp, out=tmp_path / "y.pth", e=["s/(/x/"])
    assert e.value.exit_status == 2


def test_verify():
    """verify(): ckpt verify --json's document, the model spec beside the file."""
    doc = ck.verify(f"{DATA}/fmnist_mlp.pth", "models/mnist_mlp.json",
                    reference=f"{DATA}/fmnist_mlp.ref.pth")
    rc, out, _ = run_ckpt("verify", "--json", "--model", "models/mnist_mlp.json",
                          "--reference", f"{DATA}/fmnist_mlp.ref.pth", f"{DATA}/fmnist_mlp.pth")
    assert rc == 0
    want = json.loads(out)
    assert doc.keys() == want.keys() and doc.get("passed", True) == want.get("passed", True)
    assert doc["tf32"] is False
    tf = ck.verify(f"{DATA}/fmnist_mlp.pth", "models/mnist_mlp.json", tf32=True, device="cpu",
                   reference=f"{DATA}/fmnist_mlp.ref.pth")
    assert tf["tf32"] is True and tf["tf32_note"].startswith("the CPU backend computes in FP32")
    assert tf["outputs"][0]["reference"]["rtol"] == 1e-2


def test_python_m_is_ckpt():
    """python -m ckpt_toolkit ARGS is ckpt ARGS: output and exit status."""
    for args in (["--version"], ["inspect", f"{DATA}/mlp.pth"], ["inspect", "tests/bad/empty.pth"]):
        p = subprocess.run([sys.executable, "-m", "ckpt_toolkit", *args],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False)
        assert (p.returncode, p.stdout.decode(), p.stderr.decode()) == run_ckpt(*args)


def test_native_files_missing(monkeypatch, tmp_path):
    """Without the native files: a CheckpointError naming what is missing."""
    from ckpt_toolkit import _native
    monkeypatch.setenv("CKPT_TOOLKIT_NATIVE", str(tmp_path))
    with pytest.raises(CheckpointError, match="bin/ckpt is missing"):
        ck.inspect(f"{DATA}/mlp.pth")
    monkeypatch.setattr(_native, "_lib", None)
    with pytest.raises(CheckpointError, match="libckpt.so.0 is missing"):
        ck.load(f"{DATA}/mlp.pth", framework="np")


def readme_python_blocks():
    """The Python blocks of README's Install section (its first screen) and of
    its Python section, in that order."""
    text = open("README.md", encoding="utf-8").read()
    blocks = []
    for section in ("Install", "Python"):
        m = re.search(r"^## %s\n(.*?)(?=^## )" % section, text, re.S | re.M)
        assert m, "README.md has no %s section" % section
        found = re.findall(r"```python\n(.*?)```", m.group(1), re.S)
        assert found, "README.md's %s section has no Python example" % section
        blocks += [textwrap.dedent(b) for b in found]
    return blocks


def test_readme_examples():
    """README's Python section, run as doctests: every output shown is checked
    (the blocks that use torch where torch is importable)."""
    import doctest
    blocks = readme_python_blocks()
    assert len(blocks) >= 3
    parser = doctest.DocTestParser()
    globs = {"ck": ck}  # the first block imports it, and needs torch
    for i, code in enumerate(blocks):
        if torch is None and ("torch" in code.replace("torch_load", "")
                              or "torch_load" in code):
            continue
        test = parser.get_doctest(code, globs, f"README.md Python block {i + 1}", "README.md", 0)
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
        out = io.StringIO()
        runner.run(test, out=out.write, clear_globs=False)
        assert runner.failures == 0, out.getvalue()
        globs = test.globs
    for left in glob.glob("/tmp/ckpt-example-*"):  # what the examples wrote
        os.remove(left)


@needs_torch
def test_torch_load_table_of_types(tmp_path):
    """Every type of torch_load's table, in a file this test saves with torch:
    numpy arrays, scalars and dtypes, big ints, bytes, sets, torch.Size, dtypes,
    devices, a Namespace, an OrderedDict with _metadata, a Parameter, a tensor
    that requires grad, shared and viewed storages; the same object as torch.load."""
    base = torch.arange(12, dtype=torch.float32)
    od = collections.OrderedDict(w=base.view(3, 4))
    od._metadata = collections.OrderedDict([("", {"version": 2})])
    obj = {
        "array": np.arange(6, dtype=np.int16).reshape(2, 3),
        "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
        "scalar": np.float64(1.5), "int32": np.int32(-7), "dtype": np.dtype(">u4"),
        "big": 2 ** 100, "neg": -(2 ** 70), "bytes": b"\x00\xff", "set": {1, 2},
        "frozen": frozenset({"a"}), "tuple": (1, "x", None, True, 2.5),
        "size": torch.Size([2, 3]), "torch_dtype": torch.bfloat16,
        "device": torch.device("cpu"), "args": argparse.Namespace(lr=0.1, tags=["a"]),
        "sd": od, "view": base[2:8:2], "param": torch.nn.Parameter(torch.ones(2)),
        "grad": torch.zeros(2, requires_grad=True), "list": [base, base[1:]],
        "counter": collections.Counter(a=2, b=1), "bytearray": bytearray(b"ab"),
        "complex": 1 + 2j,
    }
    path = tmp_path / "types.pth"
    torch.save(obj, path)
    want = torch.load(path, weights_only=False)  # this test's own file
    got = ck.torch_load(path)
    same_object(got, want)
    assert storages_shared(got) == storages_shared(want)
    assert got["args"].tags == ["a"] and got["dtype"].byteorder == ">"
    assert got["fortran"].flags.f_contiguous and np.array_equal(got["fortran"], obj["fortran"])
    got["sd"]["w"][0, 0] = 100.0            # one buffer: the views see it
    assert got["view"][0] == 2.0 and got["list"][0][0] == 100.0


@needs_torch
def test_torchscript_archive(tmp_path):
    """A torch.jit.save archive: its module's state dict, named as
    torch.jit.load(f).state_dict() names it; nothing compiled or run by ckpt."""
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    path = tmp_path / "net.pt"
    torch.jit.save(torch.jit.script(net), str(path))
    want = torch.jit.load(str(path), map_location="cpu").state_dict()
    got = ck.load(path)
    assert list(got) == list(want)
    for k in want:
        assert raw_bytes(got[k]) == raw_bytes(want[k]) and got[k].dtype == want[k].dtype, k
    with ck.safe_open(path, framework="np") as f:
        assert f.metadata()["source"] == "torchscript"
    sd = ck.torch_load(path)  # torch.load would hand it to torch.jit.load: its state dict
    assert list(sd) == list(want)


@needs_torch
def test_torch_load_refuses_other_globals(tmp_path):
    """A global outside the table (here collections.deque, which ckpt reads as
    plain data but torch's weights-only loader does not build) raises, naming it."""
    path = tmp_path / "deque.pth"
    torch.save({"d": collections.deque([1, 2])}, path)
    with pytest.raises(CheckpointError, match="collections.deque") as e:
        ck.torch_load(path)
    assert e.value.exit_status == 3


@needs_torch
def test_get_slice_pt():
    """get_slice with framework='pt': torch tensors of every dtype torch has
    (bfloat16 too), equal to the whole tensor's slice."""
    with ck.safe_open(f"{DATA}/dtypes.pth") as f:
        for key in ("bfloat16", "float16", "int64", "bool", "complex64", "transposed",
                    "offset_view", "permuted"):
            full = f.get_tensor(key)
            s = f.get_slice(key)
            assert s.get_shape() == list(full.shape)
            for index in [(slice(None),), (slice(1, 3),), (0,), (-1,)]:
                assert raw_bytes(s[index]) == raw_bytes(full[index]), (key, index)
        assert f.get_slice("bfloat16").get_dtype() == "BF16"
