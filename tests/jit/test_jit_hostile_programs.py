"""Program files whose program part was rewritten on purpose (issue 26, part 3).

A program file's digests catch damage, not a rewrite: anyone can change a few
bytes of the program part and recompute them. Such files must load and run,
or raise ``ProgramFileError`` (at load or at the first call), in bounded time,
never hang, crash the process or raise anything else. The fuzz loads run in
child interpreters (two at once, 100 loads each, sharing each one's verifying
child) watched by a per-load timeout; ``benchmarks/jit_fuzz.py --programs N``
runs the same at any size. The other tests check the verifier itself: one
child per process, reused, replaced when it times out, crashes or is killed,
shared by threads in turn, not inherited by a fork, gone with its process.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import io
import json
import os
import queue
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jmodule as jm
import jmodule.jit
from jmodule import nn
from jmodule.jit import _format, _validate

_X = jnp.ones((8, 16))
_VERIFY_SECONDS = 30  # the children's JMODULE_JIT_VERIFY_TIMEOUT
_LOAD_SECONDS = _VERIFY_SECONDS + 90  # a load slower than this is a hang


def _model():
    return nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.Dropout(0.1), nn.Linear(32, 4))


@pytest.fixture(scope="module")
def saved():
    buf = io.BytesIO()
    jm.jit.trace(_model(), _X).save(buf)
    return buf.getvalue()


def _parts(data):
    meta, parts = _format.decode(data, "test")
    return meta, {k: bytes(v) for k, v in parts.items()}


def _rewrite_program(meta, parts, rng, max_bytes=4):
    """The file with 1 to ``max_bytes`` bytes of its program part changed; digests recomputed."""
    program = bytearray(parts["program"])
    for _ in range(int(rng.integers(1, max_bytes + 1))):
        program[int(rng.integers(0, len(program)))] ^= int(rng.integers(1, 256))
    return _format.encode(meta, {**parts, "program": bytes(program)})


@pytest.fixture
def fresh_verdicts(monkeypatch):
    """No program verified yet in this process, and no verifier: the test starts its own."""
    monkeypatch.setattr(_validate, "_VERDICTS", {})
    monkeypatch.setattr(_validate, "_VERIFIER", None)
    yield
    if _validate._VERIFIER is not None:
        _validate._VERIFIER.close()  # then the process's own verifier is put back


@pytest.fixture
def children(monkeypatch):
    """The verifying children started during the test, in order."""
    made = []

    class Recorded(_validate._Child):
        def __init__(self, *args):
            super().__init__(*args)
            made.append(self)

    monkeypatch.setattr(_validate, "_Child", Recorded)
    return made


def _program(width):
    """A saved program file of its own (its program part differs for each width)."""
    model = nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, 4))
    buf = io.BytesIO()
    jm.jit.trace(model, _X).save(buf)
    return buf.getvalue()


def _with_program(data, program):
    meta, parts = _parts(data)
    return _format.encode(meta, {**parts, "program": program})


def _gone(pid):
    """Whether process ``pid`` has exited (reaped, or a zombie no one reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


# ------------------------------------------------------------------------ the fuzz

_WORKER = textwrap.dedent(
    """
    import json, sys
    import jax, jax.numpy as jnp
    import jmodule.jit as jit
    x = jnp.ones((8, 16))
    for path in sys.argv[1:]:
        print(json.dumps({"start": path}), flush=True)
        try:
            jax.block_until_ready(jit.load(path)(x))
            result = "loaded"
        except jit.ProgramFileError as e:
            result = type(e).__name__
        except Exception as e:
            result = "other: " + type(e).__name__ + ": " + str(e)[:200]
        print(json.dumps({"path": path, "result": result}), flush=True)
    """
)


def _drive(paths):
    """Load ``paths`` in worker interpreters; a hang or a death is an outcome, then a new worker."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", JMODULE_JIT_VERIFY_TIMEOUT=str(_VERIFY_SECONDS))
    outcomes = {}
    pending = list(paths)
    while pending:
        proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER, *pending],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        lines = queue.Queue()

        def read(proc=proc, lines=lines):
            with proc.stdout:
                for line in proc.stdout:
                    lines.put(line.decode("utf-8", "replace"))
            lines.put(None)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        started, hung = None, False
        while True:
            try:
                line = lines.get(timeout=_LOAD_SECONDS)
            except queue.Empty:
                proc.kill()
                hung = True
                break
            if line is None:
                break
            if line.startswith("{"):
                record = json.loads(line)
                if "start" in record:
                    started = record["start"]
                else:
                    outcomes[record["path"]] = record["result"]
                    started = None
        code = proc.wait()
        reader.join(30)
        if started is None and code != 0 and not hung:
            started = next((p for p in pending if p not in outcomes), None)
        if started is not None:
            outcomes[started] = "hang" if hung else f"crash (exit status {code})"
        elif pending and all(p not in outcomes for p in pending):
            raise AssertionError(f"a worker did nothing (exit status {code})")
        pending = [p for p in pending if p not in outcomes]
    return outcomes


@pytest.mark.slow
def test_rewritten_programs_load_and_run_or_raise_program_file_error(tmp_path, saved):
    meta, parts = _parts(saved)
    rng = np.random.default_rng(20260)
    paths = []
    for i in range(200):
        paths.append(str(tmp_path / f"program{i:03d}.jmjit"))
        with open(paths[-1], "wb") as f:
            f.write(_rewrite_program(meta, parts, rng))
    # Every copy passes every digest: only the program's own checks can refuse it.
    for path in paths[:5]:
        with open(path, "rb") as f:
            _format.decode(f.read(), path)
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        halves = list(pool.map(_drive, [paths[0::2], paths[1::2]]))
    outcomes = {**halves[0], **halves[1]}
    counts = collections.Counter(outcomes.values())
    print(f"{len(paths)} rewritten programs in {time.monotonic() - start:.0f} s: {dict(counts)}")
    assert sorted(outcomes) == sorted(paths)
    unexpected = {p: r for p, r in outcomes.items() if r not in ("loaded", "ProgramFileError")}
    assert not unexpected, unexpected  # no hang, crash or other exception
    assert counts["ProgramFileError"] >= 100, counts  # most changed bytes are refused


# ------------------------------------------------------------------ bounded verification


def _sleeping_child(monkeypatch):
    monkeypatch.setattr(_validate, "_CHILD", "import time\ntime.sleep(600)\n")


@pytest.mark.slow
def test_a_verification_that_does_not_finish_is_a_program_file_error(
    saved, fresh_verdicts, children, monkeypatch
):
    _sleeping_child(monkeypatch)  # a reader stuck in the program, as the fuzz once found
    start = time.monotonic()
    with pytest.raises(jm.jit.ProgramFileError, match="could not be verified in 2 seconds"):
        jm.jit.load(io.BytesIO(saved), verify_timeout=2)
    assert time.monotonic() - start < 30
    monkeypatch.setenv(_validate.VERIFY_TIMEOUT_ENV, "1.5")
    with pytest.raises(jm.jit.ProgramFileError, match=r"could not be verified in 1\.5 seconds"):
        jm.jit.load(io.BytesIO(saved))
    assert _validate._VERDICTS == {}  # a timeout is not kept: the next load tries again
    # Each timed-out child was killed and reaped, and the next load started a fresh one.
    assert len(children) == 2
    assert all(c.proc.returncode == -signal.SIGKILL for c in children)
    assert _validate._VERIFIER.child_pid is None


def test_a_verifier_that_dies_is_a_program_file_error(saved, fresh_verdicts, children, monkeypatch):
    monkeypatch.setattr(_validate, "_CHILD", "import os\nos.abort()\n")
    with pytest.raises(jm.jit.ProgramFileError, match="killed by signal"):
        jm.jit.load(io.BytesIO(saved))
    monkeypatch.setattr(_validate, "_CHILD", "import sys\nsys.exit(7)\n")
    with pytest.raises(jm.jit.ProgramFileError, match="exited with status 7"):
        jm.jit.load(io.BytesIO(saved))
    monkeypatch.setattr(sys, "executable", os.path.join(os.devnull, "no-python"))
    with pytest.raises(jm.jit.ProgramFileError, match="a child Python process could not start"):
        jm.jit.load(io.BytesIO(saved))
    assert _validate._VERDICTS == {}
    assert [c.proc.returncode for c in children] == [-signal.SIGABRT, 7]  # both reaped


def test_a_tiny_time_limit_refuses_and_bad_limits_are_value_errors(
    saved, fresh_verdicts, monkeypatch
):
    with pytest.raises(jm.jit.ProgramFileError, match=r"could not be verified in 0\.001 seconds"):
        jm.jit.load(io.BytesIO(saved), verify_timeout=0.001)
    for bad in (0, -1, float("nan"), float("inf"), "5", True):
        with pytest.raises(ValueError, match=r"verify_timeout must be a (positive|finite)"):
            jm.jit.load(io.BytesIO(saved), verify_timeout=bad)
    monkeypatch.setenv(_validate.VERIFY_TIMEOUT_ENV, "soon")
    with pytest.raises(ValueError, match="JMODULE_JIT_VERIFY_TIMEOUT must be a positive"):
        jm.jit.load(io.BytesIO(saved))


@pytest.mark.slow
def test_a_program_is_verified_once_per_process_by_one_child(
    saved, fresh_verdicts, children, monkeypatch
):
    calls = []
    real = _validate._child_verdict

    def counting(*args):
        calls.append(args[1:])
        return real(*args)

    monkeypatch.setattr(_validate, "_child_verdict", counting)
    first = jm.jit.load(io.BytesIO(saved))
    second = jm.jit.load(io.BytesIO(saved))
    assert len(calls) == 1
    assert np.asarray(first(_X)).shape == np.asarray(second(_X)).shape == (8, 4)
    garbage = _with_program(saved, b"\x00" * 64)
    for _ in range(2):  # a refusal for an error of the program is kept too
        with pytest.raises(jm.jit.ProgramFileError, match="cannot be read"):
            jm.jit.load(io.BytesIO(garbage))
    assert len(calls) == 2
    jm.jit.load(io.BytesIO(_program(24)))  # after a refusal, the same child verifies the next
    assert len(calls) == 3 and len(children) == 1
    assert _validate._VERIFIER.child_pid == children[0].proc.pid
    assert children[0].served == 3


@pytest.mark.slow
def test_a_program_the_reader_cannot_parse_is_refused_by_the_child(saved, fresh_verdicts):
    meta, parts = _parts(saved)
    exported = jax.export.deserialize(bytearray(parts["program"]))
    serialized = exported.mlir_module_serialized
    program = parts["program"].replace(serialized, b"\xff" * len(serialized))
    data = _format.encode(meta, {**parts, "program": program})
    with pytest.raises(jm.jit.ProgramFileError, match=r"^the file object .*cannot be read \(parse"):
        jm.jit.load(io.BytesIO(data))


# The real child, but one that aborts on a program starting with b"crash", as a reader
# crashing on a rewritten program would.
_CRASH_ON_MARK = textwrap.dedent(
    """
    import json, os, sys
    sys.path[:] = json.loads(sys.argv[1])
    import jax
    _deserialize = jax.export.deserialize
    def _crashing(blob):
        if bytes(blob[:5]) == b"crash":
            os.abort()
        return _deserialize(blob)
    jax.export.deserialize = _crashing
    """
)


@pytest.mark.slow
def test_a_verifier_that_crashes_or_is_killed_is_replaced(
    saved, fresh_verdicts, children, monkeypatch
):
    monkeypatch.setattr(_validate, "_CHILD", _CRASH_ON_MARK + _validate._CHILD)
    assert np.asarray(jm.jit.load(io.BytesIO(saved))(_X)).shape == (8, 4)
    with pytest.raises(jm.jit.ProgramFileError, match=f"killed by signal {signal.SIGABRT:d}"):
        jm.jit.load(io.BytesIO(_with_program(saved, b"crash" + bytes(64))))
    assert _validate._VERIFIER.child_pid is None  # the crashed one was reaped
    assert np.asarray(jm.jit.load(io.BytesIO(_program(8)))(_X)).shape == (8, 4)
    assert len(children) == 2 and children[0].proc.returncode == -signal.SIGABRT
    # Killed from outside while idle, and seen dead before the next request: replaced.
    os.kill(children[1].proc.pid, signal.SIGKILL)
    os.waitid(os.P_PID, children[1].proc.pid, os.WEXITED | os.WNOWAIT)
    assert np.asarray(jm.jit.load(io.BytesIO(_program(24)))(_X)).shape == (8, 4)
    assert len(children) == 3 and children[1].proc.returncode == -signal.SIGKILL
    # Killed while idle but not seen dead: the request finds it dead before it read the
    # request, and goes to a fresh child.
    os.kill(children[2].proc.pid, signal.SIGKILL)
    os.waitid(os.P_PID, children[2].proc.pid, os.WEXITED | os.WNOWAIT)
    monkeypatch.setattr(children[2].proc, "poll", lambda: None)
    assert np.asarray(jm.jit.load(io.BytesIO(_program(40)))(_X)).shape == (8, 4)
    assert len(children) == 4 and children[2].proc.returncode == -signal.SIGKILL
    assert _validate._VERIFIER.child_pid == children[3].proc.pid


@pytest.mark.slow
def test_loads_in_several_threads_take_turns_and_get_their_own_verdicts(
    saved, fresh_verdicts, children, monkeypatch
):
    widths = (8, 24, 40, 56)
    files = [_program(w) for w in widths]
    files += [_with_program(saved, bytes([b]) * 64) for b in (0, 1)]  # refused
    files += [saved, saved]  # the same program twice at once: verified, perhaps twice
    active, most, lock = [0], [0], threading.Lock()
    real = _validate._Child.ask

    def ask(self, *args):
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        try:
            time.sleep(0.05)  # let the other threads pile up behind this one
            return real(self, *args)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(_validate._Child, "ask", ask)
    barrier = threading.Barrier(len(files))

    def load(data):
        barrier.wait()
        try:
            return np.asarray(jm.jit.load(io.BytesIO(data))(_X)).shape
        except jm.jit.ProgramFileError as e:
            return "refused" if "cannot be read (deserialize" in str(e) else str(e)

    with concurrent.futures.ThreadPoolExecutor(len(files)) as pool:
        results = list(pool.map(load, files))
    assert results == [(8, 4)] * 4 + ["refused"] * 2 + [(8, 4)] * 2
    assert most[0] == 1  # one request at a time
    assert len(children) == 1 and 7 <= children[0].served <= 8


@pytest.mark.slow
def test_a_forked_process_starts_its_own_verifier(saved, fresh_verdicts):
    jm.jit.load(io.BytesIO(saved))
    parent_child = _validate._VERIFIER.child_pid
    assert parent_child is not None
    blob = _parts(_program(24))[1]["program"]
    x64 = bool(jax.config.read("jax_enable_x64"))
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # JAX warns that forking a threaded process is risky
        pid = os.fork()
    if pid == 0:  # the forked process: no JAX here, only the verifier
        try:
            message = [list(_validate._child_verdict(blob, x64, 60)), _validate._VERIFIER.child_pid]
        except BaseException as e:
            message = repr(e)
        os.write(write_end, json.dumps(message).encode())
        os._exit(0)
    os.close(write_end)
    deadline, data = time.monotonic() + 120, b""
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([read_end], [], [], max(deadline - time.monotonic(), 0))
            chunk = os.read(read_end, 4096) if ready else b""
            if not chunk:
                break
            data += chunk
    finally:
        os.close(read_end)
        if not data:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    verdict, forked_child = json.loads(data)
    assert verdict == ["verified", ""]
    assert forked_child not in (None, parent_child)
    # The parent's verifier is still its own, and still answers.
    assert _validate._child_verdict(blob, x64, 60) == ("verified", "")
    assert _validate._VERIFIER.child_pid == parent_child


_EXITING = textwrap.dedent(
    """
    import sys, time
    import jmodule.jit as jit
    from jmodule.jit import _validate
    jit.load(sys.argv[1])
    print(_validate._VERIFIER.child_pid, flush=True)
    if sys.argv[2] == "wait":
        time.sleep(600)
    """
)


@pytest.mark.slow
def test_the_verifier_ends_with_its_process(tmp_path, saved):
    path = tmp_path / "model.jmjit"
    path.write_bytes(saved)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    procs = {
        how: subprocess.Popen(
            [sys.executable, "-c", _EXITING, str(path), how], stdout=subprocess.PIPE, env=env
        )
        for how in ("exit", "wait")
    }
    try:
        pids = {how: int(proc.stdout.readline()) for how, proc in procs.items()}
        start = time.monotonic()
        # At a normal exit the atexit handler closes the child's stdin and reaps it.
        assert procs["exit"].wait(60) == 0
        assert time.monotonic() - start < 30
        with pytest.raises(ProcessLookupError):
            os.kill(pids["exit"], 0)
        # A process killed outright: its child sees its stdin close and exits on its own.
        procs["wait"].kill()
        procs["wait"].wait(60)
        deadline = time.monotonic() + 30
        while not _gone(pids["wait"]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(pids["wait"])
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
            proc.stdout.close()


# ------------------------------------------------------------------------- part names

_NOT_PLAIN = [
    "../../etc/x",
    "/etc/passwd",
    "state/../program",
    "..",
    ".",
    "",
    "state//0",
    "state/0/",
    "a\\b",
    "C:\\x",
    "x\x00y",
    "new\nline",
    ".hidden",
    "x" * 300,
]


@pytest.mark.parametrize("name", _NOT_PLAIN)
def test_a_metadata_entry_naming_a_path_is_refused(saved, name):
    meta, parts = _parts(saved)
    meta["arrays"][0]["part"] = name
    with pytest.raises(jm.jit.ProgramFileError, match="not a plain part name"):
        jm.jit.load(io.BytesIO(_format.encode(meta, parts)))
    meta, parts = _parts(saved)  # the table names it too: refused before any part is read
    meta["arrays"][0]["part"] = name
    parts[name] = parts.pop("state/0")
    with pytest.raises(jm.jit.ProgramFileError, match="not a plain part name"):
        jm.jit.load(io.BytesIO(_format.encode(meta, parts)))


def test_an_extra_file_naming_a_path_is_refused(saved):
    meta, parts = _parts(saved)
    meta["extra"] = [{"name": "notes.txt", "part": "../../etc/x"}]
    with pytest.raises(jm.jit.ProgramFileError, match=r"'\.\./\.\./etc/x'.*not a plain part"):
        jm.jit.load(io.BytesIO(_format.encode(meta, parts)))


def test_the_part_names_jm_writes_are_plain(saved):
    _, parts = _parts(saved)
    assert "program" in parts and "state/0" in parts
    assert all(_format.plain_part_name(name) for name in parts)
    for name in ("constant/3", "extra/0", "a.b-c_d/e.f"):
        assert _format.plain_part_name(name)
    assert not any(_format.plain_part_name(name) for name in _NOT_PLAIN)


# ----------------------------------------------------------------- the first call


def _verified_anyway(monkeypatch):
    """Let every program through the child, as a verifier that missed a problem would."""
    monkeypatch.setattr(_validate, "_child_verdict", lambda blob, x64, timeout: ("verified", ""))


def test_a_program_that_fails_to_lower_at_its_first_call_is_a_program_file_error(
    saved, fresh_verdicts, monkeypatch
):
    meta, parts = _parts(saved)
    exported = jax.export.deserialize(bytearray(parts["program"]))
    bad = dataclasses.replace(exported, mlir_module_serialized=b"\x00not StableHLO at all")
    data = _format.encode(meta, {**parts, "program": bytes(bad.serialize())})
    _verified_anyway(monkeypatch)
    loaded = jm.jit.load(io.BytesIO(data))  # its header and trees are right
    with pytest.raises(
        jm.jit.ProgramFileError, match="the file object: its program cannot be"
    ) as e:
        loaded(_X)
    assert e.value.__cause__ is not None
    assert not isinstance(e.value.__cause__, jm.jit.ProgramFileError)


def test_a_raw_lowering_error_at_the_first_call_becomes_a_program_file_error(
    tmp_path, saved, monkeypatch
):
    path = tmp_path / "model.jmjit"
    path.write_bytes(saved)
    loaded = jm.jit.load(path)
    verifier = ValueError("Cannot lower jaxpr with verifier errors")

    def lower(self, *args, **kwargs):
        raise verifier

    monkeypatch.setattr(jax.stages.Traced, "lower", lower)
    with pytest.raises(jm.jit.ProgramFileError, match=r"model\.jmjit': its program cannot be") as e:
        loaded(_X)
    assert e.value.__cause__ is verifier
    assert "Cannot lower jaxpr with verifier errors" in str(e.value)
    # Wrong inputs keep their own errors, even while the program itself would fail.
    with pytest.raises(ValueError, match="Shape mismatch") as e:
        loaded(jnp.ones((8, 15)))
    assert not isinstance(e.value, jm.jit.ProgramFileError)
    with pytest.raises(ValueError, match="Dtype mismatch"):
        loaded(jnp.ones((8, 16), jnp.int32))
    with pytest.raises(TypeError, match="must be a tuple of 1 items"):
        loaded(_X, _X)


@pytest.mark.slow
def test_loaded_programs_still_run_and_refuse_wrong_inputs_as_before(saved):
    loaded = jm.jit.load(io.BytesIO(saved))
    first = np.asarray(loaded(_X))
    assert first.shape == (8, 4) and np.isfinite(first).all()
    again = np.asarray(loaded(_X))  # training mode: statistics moved, same shape
    assert again.shape == (8, 4)
    with pytest.raises(ValueError, match="Shape mismatch") as e:
        loaded(jnp.ones((7, 16)))
    assert not isinstance(e.value, jm.jit.ProgramFileError)
    dynamic = jm.jit.trace(_model().eval(), _X, dynamic_batch=True)
    buf = io.BytesIO()
    dynamic.save(buf)
    buf.seek(0)
    reloaded = jm.jit.load(buf)
    for n in (3, 5):
        np.testing.assert_allclose(
            np.asarray(reloaded(jnp.ones((n, 16)))),
            np.asarray(dynamic(jnp.ones((n, 16)))),
            rtol=1e-5,
            atol=1e-6,
        )
