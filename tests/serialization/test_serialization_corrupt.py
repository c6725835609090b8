"""Bad input gives a clear jm error naming the file: never a crash, a hang or wrong numbers."""

from __future__ import annotations

import collections
import gc
import hashlib
import io
import json
import os
import random
import shutil
import struct
import time
import zipfile
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import jmodule.serialization as jms
from jmodule.serialization import _metafile


def _state():
    rng = np.random.default_rng(0)
    return collections.OrderedDict(
        [
            ("fc.weight", jnp.asarray(rng.standard_normal((64, 32), dtype=np.float32))),
            (
                "fc.bias",
                jnp.asarray(rng.standard_normal(64, dtype=np.float32)).astype(jnp.bfloat16),
            ),
            ("bn.num_batches_tracked", jnp.asarray(7)),
            ("epoch", 3),
        ]
    )


def _equal(a, b, ordered=True):
    if isinstance(a, dict):
        same_keys = list(a) == list(b) if ordered else sorted(a) == sorted(b)
        return same_keys and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, int):
        return a == b and type(b) is int
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.tobytes() == b.tobytes()


def _files(root: Path) -> list[Path]:
    return sorted(Path(d) / f for d, _, fs in os.walk(root) for f in fs)


def _loads_exactly_or_names(path: Path, reference, ordered: bool = True) -> str:
    """Load ``path``: the result must equal ``reference`` or raise a jm error naming the file."""
    try:
        out = jms.load(path)
    except jms.CheckpointError as e:
        assert str(path) in str(e), str(e)
        return "error"
    assert _equal(reference, out, ordered), "damaged checkpoint loaded with different values"
    return "exact"


# When one of Orbax's concurrent reads fails, Orbax closes its event loop while the other
# reads are still in flight; their completion callbacks then hit the closed loop and Python
# reports "Exception ignored ... Event loop is closed". jm has already raised its error.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@pytest.fixture(scope="module", autouse=True)
def _drain_orbax_reads():
    """Let such leftover reads finish, and be collected, inside this module's tests."""
    yield
    time.sleep(0.05)
    gc.collect()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("good") / "ckpt"
    jms.save(_state(), path)
    return path


def test_every_file_bit_flipped_is_caught_or_harmless(saved, tmp_path):
    rng = random.Random(0)
    results = collections.Counter()
    for i, file in enumerate(_files(saved)):
        for trial in range(2):
            copy = tmp_path / f"c{i}-{trial}"
            shutil.copytree(saved, copy)
            target = copy / file.relative_to(saved)
            data = bytearray(target.read_bytes())
            if not data:
                continue
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            target.write_bytes(bytes(data))
            results[_loads_exactly_or_names(copy, _state())] += 1
    assert results["error"] > 0, results  # flips in data and metadata are caught


def test_every_file_truncated_is_caught_or_harmless(saved, tmp_path):
    results = collections.Counter()
    for i, file in enumerate(_files(saved)):
        copy = tmp_path / f"c{i}"
        shutil.copytree(saved, copy)
        target = copy / file.relative_to(saved)
        data = target.read_bytes()
        target.write_bytes(data[: len(data) // 2])
        results[_loads_exactly_or_names(copy, _state())] += 1
    assert results["error"] > 0, results


def test_every_file_deleted_is_caught_or_harmless(saved, tmp_path):
    results = collections.Counter()
    for i, file in enumerate(_files(saved)):
        copy = tmp_path / f"c{i}"
        shutil.copytree(saved, copy)
        (copy / file.relative_to(saved)).unlink()
        results[_loads_exactly_or_names(copy, _state())] += 1
    assert results["error"] > 0, results


def test_empty_and_missing_directories(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(jms.CorruptCheckpointError, match="empty directory") as info:
        jms.load(tmp_path / "empty")
    assert str(tmp_path / "empty") in str(info.value)
    with pytest.raises(jms.CheckpointNotFoundError, match="does not exist") as info:
        jms.load(tmp_path / "nothing")
    assert isinstance(info.value, FileNotFoundError)


def _rewrite_body(path: Path, edit) -> None:
    """Change jmodule.json's body and re-sign it, as a buggy or hostile writer would."""
    body = _metafile.read(path)
    edit(body)
    data = json.dumps(body).encode()
    header = f"{_metafile.MAGIC} 1 sha256={hashlib.sha256(data).hexdigest()} bytes={len(data)}\n"
    (path / _metafile.NAME).write_bytes(header.encode() + data)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda b: b["arrays"][0].update(shape=[64, -1]), "array table"),
        (lambda b: b["arrays"][0].update(dtype="float99"), "array table"),
        (lambda b: b["arrays"][0].update(shape=[32, 64]), "fc.weight"),
        (lambda b: b["arrays"][0].update(stored="a7"), "cannot read the arrays"),
        (lambda b: b["tree"].update(t="set"), "tree does not parse"),
        (lambda b: b["tree"]["v"].append({"t": "array", "i": 99}), "tree does not parse"),
        (lambda b: b.update(format="other"), "array table"),
        (lambda b: b.pop("arrays"), "array table"),
    ],
)
def test_corrupted_metadata_with_a_valid_hash_is_still_refused(saved, tmp_path, edit, message):
    copy = tmp_path / "c"
    shutil.copytree(saved, copy)
    _rewrite_body(copy, edit)
    with pytest.raises(jms.CorruptCheckpointError, match=message) as info:
        jms.load(copy)
    assert str(copy) in str(info.value)


def test_metadata_header_damage(saved, tmp_path):
    cases = {
        "garbage": b"\x00\x01 not a header\n{}",
        "newer": _metafile.MAGIC.encode() + b" 99 sha256=00 bytes=2\n{}",
        "short": (saved / _metafile.NAME).read_bytes()[:-5],
        "empty": b"",
    }
    messages = {
        "garbage": "header",
        "newer": "newer jmodule",
        "short": "truncated",
        "empty": "header",
    }
    for name, data in cases.items():
        copy = tmp_path / name
        shutil.copytree(saved, copy)
        (copy / _metafile.NAME).write_bytes(data)
        with pytest.raises(jms.CorruptCheckpointError, match=messages[name]) as info:
            jms.load(copy)
        assert str(copy) in str(info.value)


def test_plain_orbax_checkpoint_is_named_as_such(tmp_path):
    import orbax.checkpoint as ocp

    checkpointer = ocp.PyTreeCheckpointer()
    checkpointer.save(tmp_path / "orbax", {"w": np.ones(3)})
    checkpointer.close()
    with pytest.raises(jms.CorruptCheckpointError, match=r"Orbax checkpoint that jm\.save did not"):
        jms.load(tmp_path / "orbax")


def test_unrecognised_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello")
    with pytest.raises(jms.CorruptCheckpointError, match="no format jm reads") as info:
        jms.load(path)
    assert str(path) in str(info.value)


# ------------------------------------------------------------------------ safetensors


@pytest.fixture(scope="module")
def safetensors_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("st") / "w.safetensors"
    sd = _state()
    del sd["epoch"]
    jms.save(sd, path)
    return path, sd


def _header_of(path: Path) -> tuple[bytes, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return raw[8 : 8 + n], raw[8 + n :]


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_fuzzed_safetensors_headers_never_crash_or_lie(safetensors_file, tmp_path_factory, data):
    path, sd = safetensors_file
    header, payload = _header_of(path)
    kind = data.draw(st.sampled_from(["bytes", "json", "length"]))
    if kind == "bytes":  # random byte edits of the JSON header
        edited = bytearray(header)
        for _ in range(data.draw(st.integers(1, 4))):
            edited[data.draw(st.integers(0, len(edited) - 1))] = data.draw(st.integers(0, 255))
        new_header, length = bytes(edited), len(edited)
    elif kind == "json":  # structurally plausible headers with random values
        entries = json.loads(header)
        key = data.draw(st.sampled_from([k for k in entries if k != "__metadata__"]))
        field = data.draw(st.sampled_from(["dtype", "shape", "data_offsets"]))
        entries[key][field] = data.draw(
            st.one_of(
                st.sampled_from(["F32", "BF16", "I64", "U8", "F8_E4M3", "??"]),
                st.lists(st.integers(-2, 2**40), max_size=3),
                st.none(),
            )
        )
        new_header = json.dumps(entries).encode()
        length = len(new_header)
    else:  # a wrong header length
        new_header = header
        length = data.draw(st.integers(0, 2**64 - 1))
    target = tmp_path_factory.mktemp("fuzz") / "w.safetensors"
    target.write_bytes(struct.pack("<Q", length) + new_header + payload)
    # Damage to the name of jm's own metadata entries makes the file read as one another
    # program wrote: same tensors, but in the sorted order safetensors lists them.
    event(f"{kind}: {_loads_exactly_or_names(target, sd, ordered=False)}")


def test_safetensors_truncated_and_bit_flipped_data(safetensors_file, tmp_path):
    path, _ = safetensors_file
    raw = path.read_bytes()
    for cut in (0, 4, 12, len(raw) // 2, len(raw) - 1):
        target = tmp_path / f"cut{cut}.safetensors"
        target.write_bytes(raw[:cut])
        with pytest.raises(jms.CheckpointError) as info:
            jms.load(target)
        assert str(target) in str(info.value)
    flipped = bytearray(raw)
    flipped[-100] ^= 0x04  # inside the last tensor's data
    target = tmp_path / "flip.safetensors"
    target.write_bytes(bytes(flipped))
    with pytest.raises(jms.CorruptCheckpointError, match="checksum") as info:
        jms.load(target)
    assert str(target) in str(info.value)


# ------------------------------------------------------------------------- PyTorch


@pytest.fixture(scope="module")
def torch_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("pt")
    obj = {"w": torch.randn(16, 8), "b": torch.randn(8).bfloat16(), "step": 3}
    torch.save(obj, d / "zip.pt")
    torch.save(obj, d / "legacy.pt", _use_new_zipfile_serialization=False)
    return d, obj


def _torch_reference(obj):
    return {
        "w": jnp.asarray(obj["w"].numpy()),
        "b": jnp.asarray(obj["b"].float().numpy()).astype(jnp.bfloat16),
        "step": 3,
    }


@pytest.mark.torch
def test_torch_files_truncated_anywhere(torch_files, tmp_path):
    d, obj = torch_files
    for name in ("zip.pt", "legacy.pt"):
        raw = (d / name).read_bytes()
        for cut in sorted({0, 1, 2, 10, 100, len(raw) // 3, len(raw) // 2, len(raw) - 8}):
            target = tmp_path / f"{cut}-{name}"
            target.write_bytes(raw[:cut])
            _loads_exactly_or_names(target, _torch_reference(obj))


@pytest.mark.torch
def test_zip_torch_file_bit_flips_are_all_caught_or_harmless(torch_files, tmp_path):
    d, obj = torch_files
    rng = random.Random(1)
    raw = (d / "zip.pt").read_bytes()
    results = collections.Counter()
    for i in range(60):
        data = bytearray(raw)
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        target = tmp_path / f"{i}.pt"
        target.write_bytes(bytes(data))
        results[_loads_exactly_or_names(target, _torch_reference(obj))] += 1  # zip CRC-32s
    assert results["error"] > 0, results


@pytest.mark.torch
def test_legacy_torch_file_bit_flips_never_escape_as_other_errors(torch_files, tmp_path):
    """The legacy format has no checksums: a flip inside raw tensor bytes changes values
    (as it does for torch.load); everywhere else it must give a jm error naming the file."""
    d, obj = torch_files
    rng = random.Random(2)
    raw = (d / "legacy.pt").read_bytes()
    data_start = len(raw) - sum(t.numel() * t.element_size() + 8 for t in (obj["w"], obj["b"]))
    results = collections.Counter()
    for i in range(60):
        data = bytearray(raw)
        at = rng.randrange(data_start)  # the pickles and storage headers
        data[at] ^= 1 << rng.randrange(8)
        target = tmp_path / f"{i}.pt"
        target.write_bytes(bytes(data))
        try:
            results[_loads_exactly_or_names(target, _torch_reference(obj))] += 1
        except AssertionError:
            results["different"] += 1
    assert results["error"] > 0, results
    assert results["different"] <= results["error"] // 4, results


@pytest.mark.torch
def test_zip_with_a_data_record_of_the_wrong_size(torch_files, tmp_path):
    d, _ = torch_files
    source = zipfile.ZipFile(d / "zip.pt")
    target = tmp_path / "short.pt"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as out:
        for info in source.infolist():
            data = source.read(info)
            if info.filename.endswith("data/0"):
                data = data[:-4]
            out.writestr(info.filename, data)
    with pytest.raises(jms.CorruptCheckpointError, match="bytes, expected") as info:
        jms.load(target)
    assert str(target) in str(info.value)


@pytest.mark.slow
def test_garbage_pickles_are_refused_cleanly(tmp_path):
    cases = {
        "truncated.pt": b"\x80\x02}q\x00(X\x01",
        "bad_opcode.pt": b"\x80\x02\xff\xff\xff",
        "not_magic.pt": b"\x80\x02K\x07.",  # a pickle of 7, not torch's magic number
        "deep.pt": b"\x80\x02" + b"]" * 100_000 + b".",
    }
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(jms.CheckpointError) as info:
            jms.load(tmp_path / name)
        assert str(tmp_path / name) in str(info.value), name


def test_zip_without_data_pkl(tmp_path):
    path = tmp_path / "x.pt"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("archive/readme", "hi")
    path.write_bytes(buffer.getvalue())
    with pytest.raises(jms.CorruptCheckpointError, match=r"without a data\.pkl"):
        jms.load(path)


@pytest.mark.slow
@pytest.mark.torch
@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_fuzzed_pickles_inside_valid_zips_never_escape(torch_files, tmp_path_factory, data):
    """A damaged data.pkl re-zipped with valid CRCs (so only the pickle reader can object)
    loads or raises a jm error naming the file; nothing else escapes, nothing is run."""
    d, _ = torch_files
    with zipfile.ZipFile(d / "zip.pt") as z:
        records = {info.filename: z.read(info) for info in z.infolist()}
    name = next(n for n in records if n.endswith("/data.pkl"))
    pkl = bytearray(records[name])
    for _ in range(data.draw(st.integers(1, 3))):
        pkl[data.draw(st.integers(0, len(pkl) - 1))] = data.draw(st.integers(0, 255))
    records[name] = bytes(pkl)
    target = tmp_path_factory.mktemp("pkl") / "fuzz.pt"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as z:
        for n, raw in records.items():
            z.writestr(n, raw)
    try:
        jms.load(target)
        event("loaded")
    except jms.CheckpointError as e:
        assert str(target) in str(e), str(e)
        event(type(e).__name__)
