"""Hostile files against every reader (issue 14, items 3, 4, 6, 7 and the program-file half of 9).

Loads that a regression would turn into a hang or unbounded memory (a pickle
DAG, a FIFO, ``/dev/zero``) run in a child interpreter with a timeout and an
RSS watchdog, so that they fail rather than hang the suite.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import struct
import subprocess
import sys
import textwrap
import tracemalloc
import zipfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _paths import ROOT
from _torch import torch

import jmodule as jm
import jmodule.jit
import jmodule.serialization as jms
from jmodule.jit import _format

# A child interpreter that runs ``cases`` (a JSON list of [name, kind, path]) and prints one
# JSON line per case; a watchdog thread ends it (exit code 3) if its RSS passes a limit.
_CHILD = textwrap.dedent(
    """
    import json, os, sys, threading, time

    def watchdog(limit):
        while True:
            with open("/proc/self/statm") as f:
                rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            if rss > limit:
                print(json.dumps({"case": "watchdog", "rss": rss}), flush=True)
                os._exit(3)
            time.sleep(0.01)

    threading.Thread(target=watchdog, args=(int(sys.argv[2]),), daemon=True).start()
    import jax.numpy as jnp
    import jmodule as jm
    import jmodule.jit

    for name, kind, path in json.loads(sys.argv[1]):
        try:
            if kind == "jit":
                jm.jit.load(path)
                out = {"loaded": True}
            else:
                obj = jm.load(path)
                out = {"loaded": True}
                if kind == "dag":
                    node, depth = obj, 0
                    while isinstance(node, list) and len(node) == 2:
                        out.setdefault("shared", True)
                        out["shared"] &= node[0] is node[1]
                        node, depth = node[0], depth + 1
                    out["depth"] = depth
                    out["leaf"] = [float(v) for v in jnp.ravel(node[0])]
        except BaseException as e:
            out = {"error": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__],
                   "message": str(e)}
        print(json.dumps({"case": name, **out}), flush=True)
    """
)


def _bounded(cases: list[tuple[str, str, Path]], timeout: float = 120.0) -> dict[str, dict]:
    """Run ``cases`` in a child interpreter, failing (not hanging) if it hangs or balloons."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    spec = json.dumps([[n, k, str(p)] for n, k, p in cases])
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, spec, str(1 << 30)],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as e:
        done = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"a load hung (ran past {timeout} s); finished before it:\n{done}")
    results = {}
    for line in proc.stdout.splitlines():
        row = json.loads(line)
        results[row.pop("case")] = row
    assert "watchdog" not in results, f"a load took more than 1 GiB: {proc.stdout}"
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert set(results) == {n for n, _, _ in cases}, proc.stdout
    return results


# ------------------------------------------------------------------ item 3: small files, big loads


@pytest.mark.slow
@pytest.mark.torch
def test_pickle_dag_loads_shared_instead_of_expanding(tmp_path):
    # torch.save pickles shared lists once, through the memo: 2**30 paths in ~1 KB.
    leaf: list = [torch.arange(3, dtype=torch.float32)]
    node = leaf
    for _ in range(30):
        node = [node, node]
    torch.save(node, tmp_path / "dag.pt")
    assert (tmp_path / "dag.pt").stat().st_size < 2048
    torch_loaded = torch.load(tmp_path / "dag.pt", weights_only=True)
    assert torch_loaded[0] is torch_loaded[1]  # PyTorch keeps the sharing too
    (result,) = _bounded([("dag", "dag", tmp_path / "dag.pt")]).values()
    assert result == {"loaded": True, "shared": True, "depth": 30, "leaf": leaf[0].tolist()}


@pytest.mark.torch
def test_tiny_storage_viewed_as_a_huge_shape_is_refused(tmp_path):
    huge = torch.zeros(1).expand(8192, 8192)
    assert huge.stride() == (0, 0) and huge.untyped_storage().nbytes() == 4
    torch.save({"x": huge}, tmp_path / "view.pt")
    with pytest.raises(jms.CorruptCheckpointError, match=r"key 'x'.*strides \(0, 0\)"):
        jms.load(tmp_path / "view.pt")
    # Views of modest size still load, equal to what PyTorch gives.
    small = torch.arange(4.0).expand(64, 4)
    torch.save({"x": small}, tmp_path / "small.pt")
    np.testing.assert_array_equal(np.asarray(jms.load(tmp_path / "small.pt")["x"]), small.numpy())


def _rezip(src: Path, dst: Path, replace: dict[str, bytes] | None = None) -> None:
    """Copy the torch zip ``src`` to ``dst`` with every record deflated (and some replaced)."""
    replace = replace or {}
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            for suffix, new in replace.items():
                if info.filename.endswith(suffix):
                    data = new
            zout.writestr(info.filename, data, compresslevel=9)


def _peak_bytes_while(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.torch
def test_deflated_zip_records_are_refused_before_inflating(tmp_path):
    n = 16 << 20  # 64 MiB of float32 zeros, which deflate to ~64 KiB
    torch.save({"x": torch.zeros(n)}, tmp_path / "big.pt")
    _rezip(tmp_path / "big.pt", tmp_path / "bomb.pt")
    torch.save({"x": torch.zeros(1)}, tmp_path / "one.pt")
    # Under the inflation limit, but not the size the pickle's storage needs:
    small = 4 * n // 8
    _rezip(tmp_path / "one.pt", tmp_path / "liar.pt", {"/data/0": bytes(small)})
    for name, inflated, match in (
        ("bomb.pt", 4 * n, "would inflate from"),
        ("liar.pt", small, "storage '0' has"),
    ):
        assert (tmp_path / name).stat().st_size < inflated // 100

        def load(name=name, match=match):
            with pytest.raises(jms.CorruptCheckpointError, match=match):
                jms.load(tmp_path / name)

        assert _peak_bytes_while(load) < inflated // 4, name
    # A modest deflated file (some tools re-zip checkpoints) still loads.
    t = torch.randn(5, 3)
    torch.save({"x": t}, tmp_path / "plain.pt")
    _rezip(tmp_path / "plain.pt", tmp_path / "deflated.pt")
    np.testing.assert_array_equal(np.asarray(jms.load(tmp_path / "deflated.pt")["x"]), t.numpy())


# -------------------------------------------------------------------- item 4: deeply nested JSON

_DEEP = "[" * 50_000 + "]" * 50_000


def _safetensors_file(path: Path, header: bytes) -> None:
    path.write_bytes(struct.pack("<Q", len(header)) + header)


def test_deep_json_in_a_safetensors_header_is_a_checkpoint_error(tmp_path):
    _safetensors_file(tmp_path / "deep.safetensors", ('{"__metadata__":' + _DEEP + "}").encode())
    with pytest.raises(jms.CorruptCheckpointError, match="levels deep"):
        jms.load(tmp_path / "deep.safetensors")
    with pytest.raises(jms.CorruptCheckpointError, match="levels deep"):
        jms.read_metadata(tmp_path / "deep.safetensors")


def test_deep_json_in_an_index_is_a_checkpoint_error(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map":' + _DEEP + "}")
    with pytest.raises(jms.CorruptCheckpointError, match="levels deep"):
        jms.load(tmp_path / "model.safetensors.index.json")
    with pytest.raises(jms.CorruptCheckpointError, match="levels deep"):
        jms.read_metadata(tmp_path / "model.safetensors.index.json")


def _write_metafile(path: Path, body: bytes) -> None:
    digest = hashlib.sha256(body).hexdigest()
    path.write_bytes(f"jmodule-checkpoint 1 sha256={digest} bytes={len(body)}\n".encode() + body)


def test_deep_json_in_jmodule_json_is_a_checkpoint_error(tmp_path):
    jms.save({"w": jnp.ones(3)}, tmp_path / "ckpt")
    body = (tmp_path / "ckpt" / "jmodule.json").read_bytes().split(b"\n", 1)[1]
    deep = body[:-1] + (',"deep":' + _DEEP + "}").encode()  # digest recomputed: no damage
    _write_metafile(tmp_path / "ckpt" / "jmodule.json", deep)
    with pytest.raises(jms.CorruptCheckpointError, match="levels deep"):
        jms.load(tmp_path / "ckpt")


def test_brackets_inside_strings_do_not_count_as_nesting(tmp_path):
    text = '["{\\"' * 300 + "\\\\" + '"]' * 7  # brackets, escaped quotes and backslashes
    tree = {"w": jnp.arange(3.0), "note": text, "nested": [[[["x"]]]]}
    jms.save(tree, tmp_path / "ckpt")
    out = jms.load(tmp_path / "ckpt")
    assert out["note"] == text and out["nested"] == [[[["x"]]]]
    jms.save({"w": jnp.ones(2)}, tmp_path / "w.safetensors", metadata={"note": text})
    assert jms.read_metadata(tmp_path / "w.safetensors")["note"] == text


def test_save_refuses_structures_nested_deeper_than_load_reads(tmp_path):
    from jmodule.serialization import _tree

    ok: object = {"w": jnp.ones(2)}
    for _ in range(_tree.MAX_DEPTH - 1):
        ok = {"k": ok}
    jms.save(ok, tmp_path / "ok")
    node = jms.load(tmp_path / "ok")
    for _ in range(_tree.MAX_DEPTH - 1):
        node = node["k"]
    np.testing.assert_array_equal(np.asarray(node["w"]), np.ones(2))
    with pytest.raises(TypeError, match="nested more than"):
        jms.save([ok], tmp_path / "deep")
    assert not (tmp_path / "deep").exists()


def test_deep_json_in_a_program_header_is_a_program_file_error(tmp_path):
    header = ('{"meta":' + _DEEP + ',"parts":[],"data_length":0}').encode()
    prefix = struct.pack("<8sIQ", _format.MAGIC, _format.FORMAT_VERSION, len(header))
    data = prefix + header + hashlib.sha256(prefix + header).digest()  # valid digest
    (tmp_path / "deep.jmjit").write_bytes(data)
    with pytest.raises(jm.jit.ProgramFileError, match="levels deep"):
        jm.jit.load(tmp_path / "deep.jmjit")
    with pytest.raises(jm.jit.ProgramFileError, match="levels deep"):
        jm.jit.load(io.BytesIO(data))


# ------------------------------------------------------------ item 6: Hugging Face hub cache layout


def _hub_cache(root: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """A ``models--org--net`` hub cache: index and shards in snapshots/<rev>/ link to blobs/."""
    repo = root / "models--org--net"
    blobs, snap = repo / "blobs", repo / "snapshots" / "0123abcd"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    rng = np.random.default_rng(0)
    expected, weight_map = {}, {}
    for i, key in enumerate(("a.weight", "b.weight")):
        name = f"model-{i + 1:05d}-of-00002.safetensors"
        expected[key] = rng.standard_normal((3, 2)).astype(np.float32)
        jms.save({key: expected[key]}, root / name)
        blob = hashlib.sha256((root / name).read_bytes()).hexdigest()
        (root / name).rename(blobs / blob)
        (snap / name).symlink_to(f"../../blobs/{blob}")
        weight_map[key] = name
    index = json.dumps({"metadata": {"total_size": 48}, "weight_map": weight_map}).encode()
    blob = hashlib.sha256(index).hexdigest()
    (blobs / blob).write_bytes(index)
    (snap / "model.safetensors.index.json").symlink_to(f"../../blobs/{blob}")
    return snap, expected


def test_hugging_face_hub_cache_snapshots_load(tmp_path):
    snap, expected = _hub_cache(tmp_path)
    out = jms.load(snap / "model.safetensors.index.json")
    assert list(out) == list(expected)
    for key, value in expected.items():
        np.testing.assert_array_equal(np.asarray(out[key]), value)
    one = jms.load(snap / "model-00002-of-00002.safetensors")  # a shard, directly
    np.testing.assert_array_equal(np.asarray(one["b.weight"]), expected["b.weight"])
    assert jms.read_metadata(snap / "model.safetensors.index.json") == {"total_size": "48"}
    # A module loads from the cache too (through its state_dict keys).
    net = jm.nn.Linear(2, 3, bias=False)
    net.load_state_dict({"weight": jms.load(snap / "model-00001-of-00002.safetensors")["a.weight"]})
    np.testing.assert_array_equal(np.asarray(net.weight), expected["a.weight"])


@pytest.mark.parametrize(
    "name", ["../model-00001-of-00002.safetensors", "/etc/passwd", "a/../../x", "", "a\\..\\x"]
)
def test_index_names_may_still_not_leave_their_directory(tmp_path, name):
    snap, _ = _hub_cache(tmp_path)
    inner = snap / "sub"
    inner.mkdir()
    (inner / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": name}}))
    with pytest.raises(jms.CorruptCheckpointError, match="outside its own directory"):
        jms.load(inner / "model.safetensors.index.json")


# ------------------------------------------------------------- item 7: FIFOs, devices, directories


def _replace(path: Path, kind: str) -> None:
    if path.is_dir() and not path.is_symlink():
        for p in path.iterdir():
            p.unlink()
        path.rmdir()
    elif path.exists() or path.is_symlink():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()


@pytest.mark.slow
def test_special_files_are_refused_before_reading(tmp_path):
    cases, offender = [], {}  # offender: the special file each message must name
    for kind in ("fifo", "zero", "dir"):
        ckpt = tmp_path / f"ckpt-{kind}"
        jms.save({"w": jnp.ones(3)}, ckpt)
        _replace(ckpt / "jmodule.json", kind)
        cases.append((f"jmodule.json-{kind}", "load", ckpt))
        offender[cases[-1][0]] = ckpt / "jmodule.json"
    for kind, name in (("fifo", "w.pt"), ("zero", "w.pt"), ("fifo", "w.safetensors")):
        _replace(tmp_path / f"{kind}-{name}", kind)
        cases.append((f"{name}-{kind}", "load", tmp_path / f"{kind}-{name}"))
    _replace(tmp_path / "zero-model.safetensors.index.json", "zero")
    cases.append(("index-zero", "load", tmp_path / "zero-model.safetensors.index.json"))
    shards = tmp_path / "shards"
    shards.mkdir()
    _replace(shards / "model-00001-of-00001.safetensors", "fifo")
    weight_map = {"w": "model-00001-of-00001.safetensors"}
    (shards / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    cases.append(("shard-fifo", "load", shards / "model.safetensors.index.json"))
    offender["shard-fifo"] = shards / "model-00001-of-00001.safetensors"
    ckpt = tmp_path / "ckpt-arrays"
    jms.save({"w": jnp.ones(3)}, ckpt)
    manifest = next(p for p in sorted(ckpt.rglob("*")) if p.is_file() and "arrays" in p.parts)
    _replace(manifest, "fifo")
    cases.append(("orbax-file-fifo", "load", ckpt))
    offender["orbax-file-fifo"] = manifest
    for kind in ("fifo", "zero"):
        _replace(tmp_path / f"{kind}.jmjit", kind)
        cases.append((f"jit-{kind}", "jit", tmp_path / f"{kind}.jmjit"))

    results = _bounded(cases)
    for name, kind, path in cases:
        result = results[name]
        assert "error" in result, (name, result)
        wanted = "ProgramFileError" if kind == "jit" else "CheckpointError"
        assert wanted in result["mro"], (name, result)
        assert "not a regular file" in result["message"], (name, result)
        assert f"'{offender.get(name, path)}'" in result["message"], (name, result)


# -------------------------------------------------- item 9: program files rewritten on purpose


class _Net(jm.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = jm.nn.Linear(6, 4)
        self.bn = jm.nn.BatchNorm1d(4)

    def forward(self, x):
        return {"y": self.bn(self.fc(x)), "aux": (x.sum(),)}


_X = jnp.arange(24.0).reshape(4, 6) / 10


@pytest.fixture(scope="module")
def traced():
    net = _Net().eval()
    buf = io.BytesIO()
    jm.jit.trace(net, _X).save(buf)
    return buf.getvalue(), net(_X)


@pytest.fixture(scope="module")
def program(traced):
    return traced[0]


def _garbage_program(meta, parts):
    exported = jax.export.deserialize(bytearray(parts["program"]))
    bad = dataclasses.replace(exported, mlir_module_serialized=b"\x00not StableHLO at all")
    parts["program"] = bytes(bad.serialize())


def _set(path, value):
    def change(meta, parts):
        *head, last = path
        node = meta
        for k in head:
            node = node[k]
        node[last] = value(node[last]) if callable(value) else value

    return change


_REWRITES = {
    "state array dtype": (_set(["arrays", 0, "dtype"], "int32"), "int32"),
    "unknown dtype string": (_set(["arrays", 0, "dtype"], "float33"), "unknown dtype"),
    "state array shape": (_set(["arrays", 0, "shape"], lambda s: s[::-1]), "float32"),
    "inputs not a tuple": (_set(["inputs"], lambda s: {"list": s["tuple"]}), "inputs"),
    "unknown output node": (_set(["output"], lambda s: {"tuple2": s}), "unknown tree node"),
    "output leaf count": (_set(["output", "dict"], lambda s: s[:1]), "returns"),
    "tree drops a parameter": (_set(["tree", 1, "params"], []), "does not hold"),
    "tree cycle": (_set(["tree", 1, "children"], [["loop", 1]]), "contains itself"),
    "tree child out of range": (_set(["tree", 0, "children"], [["x", 9]]), "out of range"),
    "changed names more state": (_set(["changed"], lambda s: ["fc.weight", *s]), "returns"),
    "garbage StableHLO": (_garbage_program, "cannot be read"),
}


@pytest.mark.parametrize("case", list(_REWRITES))
def test_rewritten_program_headers_fail_at_load(program, case):
    change, match = _REWRITES[case]
    meta, parts = _format.decode(program, "test")
    parts = {k: bytes(v) for k, v in parts.items()}
    change(meta, parts)
    data = _format.encode(meta, parts)  # every digest recomputed
    with pytest.raises(jm.jit.ProgramFileError, match=match):
        jm.jit.load(io.BytesIO(data))


def test_unrewritten_program_still_loads_and_runs(traced):
    data, expected = traced
    out = jm.jit.load(io.BytesIO(data))(_X)
    assert set(out) == {"y", "aux"} and len(out["aux"]) == 1
    np.testing.assert_allclose(np.asarray(out["y"]), np.asarray(expected["y"]), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(out["aux"][0]), np.asarray(expected["aux"][0]), rtol=1e-5)
