"""Checking a program file's header and program, at load time.

The digests of a program file catch damage, not a file rewritten on purpose
(digests recomputed). So that such a file fails in ``jm.jit.load`` with a
:class:`ProgramFileError` rather than at its first call (``KeyError``, or
XLA failing to read the program), :func:`check_meta` checks every field the
loader and the loaded program use (types, the input and output trees, the
module tree, the state arrays' shapes and dtypes, the part names), and
:func:`check_program` checks them against the deserialized ``jax.export``
program.

Untrusted program bytes never reach JAX's deserializer or MLIR's StableHLO
parser in this process before :func:`verify_program` has run them in a
child: a changed byte of StableHLO bytecode can make the parser loop for
minutes, crash the process or read a program that XLA then refuses to
lower. The child, the *verifier*, is one interpreter per process
(``sys.executable``, with this process's ``sys.path``, JAX on the CPU),
started at the first verification and kept for the next ones: for each
request (the program part, and this process's ``jax_enable_x64``, sent over
its stdin) it deserializes the program, parses its StableHLO and lowers a
call of it for its saved input shapes and platforms (what the first call
does, MLIR's verifier included), and writes a verdict line to its stdout.
Requests from several threads take turns (the verifier's lock). A request
not answered within the time limit (the child's start included, for the
first) has its child killed and the load raises a :class:`ProgramFileError`
saying the program could not be verified in that many seconds; a child that
dies (a signal, an abort) or reports an error makes the load raise one too.
Either way the next request starts a fresh child (a child found dead before
it read a request, killed while idle, is replaced and asked again). The
limit is ``verify_timeout`` seconds (``jm.jit.load``'s keyword), else the
environment variable ``JMODULE_JIT_VERIFY_TIMEOUT``, else
:data:`DEFAULT_VERIFY_TIMEOUT`.

The child exits when its stdin closes: at this process's exit (an ``atexit``
handler closes it, and kills the child if it has not exited within
:data:`_EXIT_GRACE` seconds) or death. Should it be stuck in the reader
then, its own CPU-time limit (twice the request's time limit, plus 10
seconds) ends it. A forked child of this process does not use its parent's
verifier: it starts its own. One child verifies at most :data:`_MAX_REQUESTS`
programs, then is replaced.

Starting the verifier costs about a second (an interpreter importing JAX),
once per process; a program it has not seen takes about 10 ms more for a
small model. Verdicts that do not depend on the machine's load (verified, or
refused for an error) are kept in this process by the sha256 of the program
part and the ``jax_enable_x64`` setting, so a program loaded again is not
sent again. A timeout or a death is not kept (the next load tries again).
The loaded program's first call for each input signature lowers the program
again in this process (the child lowered it for its saved, possibly symbolic,
shapes); an error there is a :class:`ProgramFileError` too (see
``_restored.LoadedProgram``).
"""

from __future__ import annotations

import atexit
import collections
import hashlib
import json
import math
import os
import queue
import re
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from jmodule._lowering.state import RNG_NAME
from jmodule.jit import _format, _spec
from jmodule.jit._errors import IncompatibleVersionError, ProgramFileError
from jmodule.jit._restored import check_tree

_CONSTRAINT = re.compile(r"^\s*[A-Za-z_]\w*\s*>=\s*\d+\s*$")

#: Seconds ``jm.jit.load`` gives the verification of a program it has not verified before.
DEFAULT_VERIFY_TIMEOUT = 60.0
#: The environment variable that sets that limit (seconds) when ``verify_timeout`` is not given.
VERIFY_TIMEOUT_ENV = "JMODULE_JIT_VERIFY_TIMEOUT"


def _strs(value: Any, what: str, unique: bool = True) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise ValueError(f"{what} is not a list of strings")
    if unique and len(set(value)) != len(value):
        raise ValueError(f"{what} names something twice")
    return value


def _array_info(info: Any, what: str) -> None:
    if not (
        isinstance(info, dict)
        and isinstance(info.get("name"), str)
        and isinstance(info.get("part"), str)
        and isinstance(info.get("dtype"), str)
        and isinstance(info.get("shape"), list)
        and all(type(d) is int and d >= 0 for d in info["shape"])
    ):
        raise ValueError(f"malformed {what} entry {str(info)[:100]}")
    try:
        jax.numpy.dtype(info["dtype"])
    except TypeError:
        raise ValueError(
            f"{what} '{info['name']}' has an unknown dtype {info['dtype']!r}"
        ) from None


def check_meta(meta: dict[str, Any], parts: Mapping[str, Any], where: str) -> None:
    """Check the fields of ``meta`` that loading and running use.

    Raises:
        ProgramFileError: naming the first field that is malformed.
    """
    try:
        state = _strs(meta.get("state"), "the state list")
        if not state or state[-1] != RNG_NAME:
            raise ValueError("the state list does not end with the random key")
        changed = _strs(meta.get("changed"), "the list of changed state")
        if not set(changed) <= set(state):
            raise ValueError("the list of changed state names state the program does not take")
        modes = meta.get("modes")
        if not isinstance(modes, dict) or not all(isinstance(v, bool) for v in modes.values()):
            raise ValueError("the modes are not a mapping of module paths to booleans")
        names = meta.get("arg_names")
        if names is not None:
            _strs(names, "the argument names", unique=False)
        inputs = meta.get("inputs")
        if not (
            isinstance(inputs, dict)
            and set(inputs) == {"tuple"}
            and isinstance(inputs["tuple"], list)
            and len(inputs["tuple"]) == 2
            and isinstance(inputs["tuple"][0], dict)
            and set(inputs["tuple"][0]) == {"tuple"}
            and isinstance(inputs["tuple"][1], dict)
            and set(inputs["tuple"][1]) == {"dict"}
        ):
            raise ValueError("the inputs are not a pair (positional arguments, keyword arguments)")
        _spec.check(inputs, inputs=True)
        if any(type(k) is not str for k, _ in inputs["tuple"][1]["dict"]):
            raise ValueError("a keyword argument is not named by a string")
        _spec.check(meta.get("output"), inputs=False)
        constraint = meta.get("batch_constraint", "")
        if not isinstance(constraint, str) or (constraint and not _CONSTRAINT.match(constraint)):
            raise ValueError(f"the batch constraint {str(constraint)[:40]!r} is malformed")
        arrays = meta.get("arrays")
        if not isinstance(arrays, list):
            raise ValueError("the state arrays are not a list")
        for info in arrays:
            _array_info(info, "state array")
        if [a["name"] for a in arrays] != [n for n in state if n != RNG_NAME]:
            raise ValueError("the state arrays are not the program's state, in order")
        views = meta.get("views")
        if not isinstance(views, dict) or not all(
            isinstance(views.get(k), str) for k in ("graph", "inlined_graph", "code")
        ):
            raise ValueError("the views are not the graph, inlined graph and code texts")
        constants = views.get("constants")
        if not isinstance(constants, list):
            raise ValueError("the code constants are not a list")
        for c in constants:
            if isinstance(c, dict) and "part" in c:
                _array_info(c, "code constant")
            elif not (isinstance(c, dict) and isinstance(c.get("name"), str)):
                raise ValueError(f"malformed code constant {str(c)[:100]}")
        extra = meta.get("extra")
        if not isinstance(extra, list) or not all(
            isinstance(e, dict)
            and isinstance(e.get("name"), str)
            and isinstance(e.get("part"), str)
            for e in extra
        ):
            raise ValueError("the extra files are not a list of named parts")
        named = (*arrays, *(c for c in constants if "part" in c), *extra)
        for entry in named:
            if not _format.plain_part_name(entry["part"]):
                raise ValueError(
                    f"'{entry['name'][:60]}' names the part {entry['part'][:60]!r}, which is not "
                    "a plain part name (a path, '..', a separator or a NUL)"
                )
        if any(e["part"] not in parts for e in named):
            raise ValueError("an array or extra file names a part the file does not have")
        if "program" not in parts:
            raise ValueError("there is no program part")
        check_tree(meta.get("tree"), set(state))
    except ValueError as e:
        raise ProgramFileError(
            f"{where} has an inconsistent header: {e}. It was rewritten or written by another "
            "program; save the program again with jm.jit.save."
        ) from None


def check_program(meta: dict[str, Any], exported: Any, where: str) -> None:
    """Check ``meta`` (already :func:`check_meta`-ed) against the deserialized ``exported``.

    ``exported`` comes from a program :func:`verify_program` verified.

    Raises:
        ProgramFileError: the program takes or returns other trees, or other
            state shapes and dtypes, than the header says.
    """
    state, changed = meta["state"], meta["changed"]
    n_in = _spec.check(meta["inputs"])
    n_out = _spec.check(meta["output"], inputs=False)
    tree = jax.tree_util.tree_structure
    problem = None
    if exported.in_tree != tree(((list(state), [0] * n_in), {})):
        problem = f"takes {exported.in_tree}, not {len(state)} state arrays and {n_in} inputs"
    elif exported.out_tree != tree(([0] * n_out, list(changed))):
        problem = (
            f"returns {exported.out_tree}, not {n_out} outputs and {len(changed)} state updates"
        )
    else:
        for info, aval in zip(meta["arrays"], exported.in_avals):
            shape, dtype = tuple(info["shape"]), np.dtype(jax.numpy.dtype(info["dtype"]))
            if tuple(aval.shape) != shape or np.dtype(aval.dtype) != dtype:
                problem = (
                    f"takes '{info['name']}' as {aval.dtype}{list(aval.shape)}, the file holds "
                    f"it as {dtype}{list(shape)}"
                )
                break
    if problem is not None:
        raise ProgramFileError(
            f"{where} does not match its header: the program {problem}. It was rewritten or "
            "damaged; save the program again with jm.jit.save."
        )


def verify_timeout(value: float | None = None) -> float:
    """The time limit of :func:`verify_program`, in seconds.

    Args:
        value: ``jm.jit.load``'s ``verify_timeout``; None reads the environment
            variable ``JMODULE_JIT_VERIFY_TIMEOUT``, and without it
            :data:`DEFAULT_VERIFY_TIMEOUT`.

    Raises:
        ValueError: the value (or the variable) is not a positive number of seconds.
    """
    what = "verify_timeout"
    if value is None:
        raw = os.environ.get(VERIFY_TIMEOUT_ENV, "").strip()
        if not raw:
            return DEFAULT_VERIFY_TIMEOUT
        what = f"the environment variable {VERIFY_TIMEOUT_ENV}"
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{what} must be a positive number of seconds, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number of seconds, got {value!r}")
    return float(value)


# The verifying child: a loop answering requests on its stdin. Each request is _REQUEST
# (request id, program length, CPU seconds it may take, jax_enable_x64) then the program;
# each answer a JSON line on its stdout: {"id", "ack"} once the request is read, then
# {"id", "stage", "error"}. Its arguments: sys.path (JSON), the CPU seconds its start may take.
# It exits when its stdin closes (this process closed it, or died).
_REQUEST = struct.Struct("<QQQB")
_CHILD = r"""
import json, os, signal, struct, sys
sys.path[:] = json.loads(sys.argv[1])
signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's; it then closes our stdin
try:
    import resource
except ImportError:
    resource = None

def limit_cpu(seconds):
    # At most `seconds` more CPU seconds: an orphan stuck in the reader must not spin for ever.
    if resource is not None:
        try:
            used = resource.getrusage(resource.RUSAGE_SELF)
            hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
            soft = int(used.ru_utime + used.ru_stime) + seconds
            if hard != resource.RLIM_INFINITY:
                soft = min(soft, hard)
            resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
        except (ValueError, OSError):
            pass

limit_cpu(int(sys.argv[2]))
if resource is not None:
    try:  # a reader that crashes leaves no core file
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ValueError, OSError):
        pass
answers = os.dup(1)
os.dup2(2, 1)  # whatever else is printed goes to stderr

def send(message):
    data = (json.dumps(message) + "\n").encode()
    while data:
        data = data[os.write(answers, data):]

def read(n):
    chunks = []
    while n:
        chunk = os.read(0, min(n, 1 << 24))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)

try:
    import jax
    from jax.interpreters import mlir
    start_error = None
except Exception as e:
    start_error = type(e).__name__ + ": " + str(e)[:1000]

def verdict(blob, x64):
    stage = "deserialize"
    try:
        if bool(jax.config.read("jax_enable_x64")) != x64:
            jax.config.update("jax_enable_x64", x64)
        exported = jax.export.deserialize(bytearray(blob))
        stage = "parse"
        with mlir.make_ir_context():
            exported.mlir_module(serialized=False)
        stage = "lower"
        avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in exported.in_avals]
        args, kwargs = jax.tree_util.tree_unflatten(exported.in_tree, avals)
        platforms = tuple(exported.platforms)
        jax.jit(exported.call).trace(*args, **kwargs).lower(lowering_platforms=platforms)
    except Exception as e:
        return stage, type(e).__name__ + ": " + str(e)[:1000]
    return "verified", ""

HEADER = struct.Struct(sys.argv[3])
while True:
    header = read(HEADER.size)
    if header is None:
        break
    ident, size, seconds, x64 = HEADER.unpack(header)
    blob = read(size)
    if blob is None:
        break
    send({"id": ident, "ack": True})
    limit_cpu(seconds)
    if start_error is not None:
        send({"id": ident, "stage": "start", "error": start_error})
        break
    stage, error = verdict(blob, bool(x64))
    send({"id": ident, "stage": stage, "error": error})
"""

# Verdicts that may depend on the machine's load or setup, not kept: the next load tries again.
_UNKEPT = ("timeout", "died", "no verdict", "start")
# sha256 of a program part and jax_enable_x64 -> the child's verdict (its stage and error),
# the oldest dropped past _MAX_VERDICTS.
_VERDICTS: dict[tuple[str, bool], tuple[str, str]] = {}
_MAX_VERDICTS = 4096
_VERDICTS_LOCK = threading.Lock()
#: Programs one child verifies before it is replaced (bounding what JAX keeps in it).
_MAX_REQUESTS = 1000
#: Seconds a child whose stdin was closed may take to exit before it is killed.
_EXIT_GRACE = 2.0


def _cpu_seconds(timeout: float) -> int:
    """CPU seconds the child may spend on a request of ``timeout`` seconds, were it orphaned."""
    return min(math.ceil(2 * timeout) + 10, 1 << 40)


class _Child:
    """One verifying child process (see ``_CHILD``), its pipes and the threads reading them.

    Attributes:
        proc: the process.
        served: the requests it answered.
    """

    def __init__(self, timeout: float):
        env = dict(os.environ, JAX_PLATFORMS="cpu")  # never the accelerators this process holds
        command = [sys.executable, "-P", "-c", _CHILD, json.dumps(sys.path)]
        command += [str(_cpu_seconds(timeout)), _REQUEST.format]
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            bufsize=0,  # raw pipes: no buffer to flush, no lock a fork could leave held
        )
        self.served = 0
        self._lines: queue.Queue[bytes | None] = queue.Queue()
        self._stderr: collections.deque[str] = collections.deque(maxlen=20)
        self._writer: threading.Thread | None = None
        self._readers = [
            threading.Thread(target=self._read_lines, name="jm-jit-verifier-out", daemon=True),
            threading.Thread(target=self._read_stderr, name="jm-jit-verifier-err", daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read_lines(self) -> None:
        pipe, pending = self.proc.stdout, b""
        assert pipe is not None
        with pipe:
            while chunk := _read_some(pipe):
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    self._lines.put(line)
        self._lines.put(None)

    def _read_stderr(self) -> None:
        pipe, pending = self.proc.stderr, b""
        assert pipe is not None
        with pipe:
            while chunk := _read_some(pipe):
                *lines, pending = (pending + chunk).split(b"\n")
                pending = pending[-4096:]
                for line in lines:
                    if line.strip():
                        self._stderr.append(line.decode("utf-8", "replace").strip()[:300])
        if pending.strip():
            self._stderr.append(pending.decode("utf-8", "replace").strip()[:300])

    def _write(self, *data: bytes) -> None:
        pipe = self.proc.stdin
        assert pipe is not None
        try:
            for part in data:
                view = memoryview(part)
                while view:
                    view = view[pipe.write(view) :]
        except (OSError, ValueError):  # the child died or was stopped: its stdout says so
            pass

    def ask(
        self, ident: int, blob: bytes, x64: bool, timeout: float, deadline: float
    ) -> tuple[str, str, bool]:
        """Send one request and wait, until ``deadline`` (monotonic), for the verdict.

        Returns:
            ``(stage, error, acked)``; ``acked``: the child had read the request.
            A child that did not answer in time or broke the protocol must be stopped.
        """
        header = _REQUEST.pack(ident, len(blob), _cpu_seconds(timeout), int(x64))
        self._stderr.clear()  # what it writes from now on is about this request
        # Written by a thread: a child that does not read (starting, stuck) cannot block us.
        self._writer = threading.Thread(
            target=self._write, args=(header, blob), name="jm-jit-verifier-in", daemon=True
        )
        self._writer.start()
        acked = False
        while True:
            try:
                wait = min(max(deadline - time.monotonic(), 0.0), threading.TIMEOUT_MAX)
                line = self._lines.get(timeout=wait)
            except queue.Empty:
                return "timeout", "", acked
            if line is None:
                return (*self._death(), acked)
            try:
                message = json.loads(line)
            except ValueError:
                message = None
            if not isinstance(message, dict) or message.get("id") != ident:
                return "no verdict", f"it printed {line[:100]!r}", acked
            if message.get("ack") is True and not acked:
                acked = True
                continue
            if not acked:
                return "no verdict", f"it answered {line[:100]!r} before reading", acked
            self._writer.join()  # it wrote all: the child had read the request
            self._writer = None
            return str(message.get("stage")), str(message.get("error", "")), acked

    def _death(self) -> tuple[str, str]:
        """Why the child closed its stdout: the verdict of a child that gave none."""
        try:
            code = self.proc.wait(_EXIT_GRACE)
        except subprocess.TimeoutExpired:  # alive, its stdout closed: not our child's code
            self.stop(0)
            return "no verdict", "it closed its output"
        self._readers[1].join(_EXIT_GRACE)
        last = self._stderr[-1] if self._stderr else "no message"
        if code < 0:
            return "died", f"it was killed by signal {-code} ({last})"
        return "no verdict", f"it exited with status {code} ({last})"

    def stop(self, grace: float) -> None:
        """End the child: its stdin closed, and after ``grace`` seconds killed; reaped."""
        writing = self._writer is not None and self._writer.is_alive()
        if grace > 0 and not writing:
            _close(self.proc.stdin)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        if self.proc.poll() is None:
            try:
                self.proc.kill()
            except OSError:
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:  # unkillable for now: subprocess reaps it later
                pass
        if self._writer is not None:
            self._writer.join(10)  # the child is gone: its write fails at once
        _close(self.proc.stdin)
        for reader in self._readers:
            reader.join(10)  # each closes its own pipe at its end

    def abandon(self) -> None:
        """In a forked child of the process that started it: close this copy of its pipes.

        No thread of the parent runs here, so nothing else reads or writes them;
        the process stays the parent's (kept referenced, never waited for here).
        """
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            _close(pipe)
        _ABANDONED.append(self)


def _read_some(pipe: Any) -> bytes:
    try:
        return pipe.read(1 << 16) or b""
    except (OSError, ValueError):
        return b""


def _close(pipe: Any) -> None:
    try:
        if pipe is not None:
            pipe.close()
    except OSError:
        pass


# Children of a parent process, seen in a forked process: never used or waited for there.
_ABANDONED: list[_Child] = []


class _Verifier:
    """This process's verifying child: started at its first request, replaced when it fails.

    Requests are serialized by the verifier's lock: a load waits for the
    verifications other threads started before it (each bounded by its own
    time limit). A child that times out is killed; one that dies or breaks
    the protocol is reaped; either is replaced at the next request. A child
    found dead before it read a request (killed while idle) is replaced and
    the request sent again, once.

    Attributes:
        owner: the process this verifier belongs to (a forked child makes its own).
    """

    def __init__(self) -> None:
        self.owner = os.getpid()
        self._lock = threading.Lock()
        self._child: _Child | None = None
        self._ident = 0

    @property
    def child_pid(self) -> int | None:
        """The running child's process id, None before the first request or after a failure."""
        child = self._child
        return None if child is None else child.proc.pid

    def verify(self, blob: bytes, x64: bool, timeout: float) -> tuple[str, str]:
        """The verdict on ``blob``: ``(stage, error)``; stage "verified" if no error.

        Stages that need not be the program's fault: "start" (no child, or one
        that could not import JAX), "timeout", "died", "no verdict".
        """
        with self._lock:
            deadline = time.monotonic() + timeout
            for attempt in range(2):
                fresh = self._child is None or self._child.proc.poll() is not None
                if fresh:
                    self._stop(0)
                    try:
                        self._child = _Child(timeout)
                    except (OSError, TypeError, ValueError) as e:  # no such file, no executable
                        return "start", f"{type(e).__name__}: cannot start {sys.executable!r}: {e}"
                child = self._child
                assert child is not None
                self._ident += 1
                stage, error, acked = child.ask(self._ident, blob, x64, timeout, deadline)
                if stage not in _UNKEPT:
                    child.served += 1
                    if child.served >= _MAX_REQUESTS:
                        self._stop(_EXIT_GRACE)
                    return stage, error
                self._stop(0 if stage == "timeout" else _EXIT_GRACE)
                if attempt or fresh or acked or stage not in ("died", "no verdict"):
                    return stage, error
            raise AssertionError("unreachable")

    def _stop(self, grace: float) -> None:
        child, self._child = self._child, None
        if child is not None:
            child.stop(grace)

    def close(self) -> None:
        """Stop the child (at interpreter exit): its stdin closed, then killed if need be.

        Does not wait for a verification in flight in another thread: that one
        then reports the child's death.
        """
        locked = self._lock.acquire(blocking=False)
        try:
            self._stop(_EXIT_GRACE if locked else 0)
        finally:
            if locked:
                self._lock.release()

    def abandon(self) -> None:
        """Forget the child, in a forked process (see :meth:`_Child.abandon`)."""
        child, self._child = self._child, None
        if child is not None:
            child.abandon()


_VERIFIER: _Verifier | None = None
_VERIFIER_LOCK = threading.Lock()


def _the_verifier() -> _Verifier:
    """This process's verifier, made at the first call (and anew in a forked child)."""
    global _VERIFIER
    with _VERIFIER_LOCK:
        if _VERIFIER is None or _VERIFIER.owner != os.getpid():
            if _VERIFIER is not None:
                _VERIFIER.abandon()
            _VERIFIER = _Verifier()
        return _VERIFIER


def _child_verdict(blob: bytes, x64: bool, timeout: float) -> tuple[str, str]:
    """The verifying child's ``(stage, error)`` on ``blob`` (see :meth:`_Verifier.verify`)."""
    return _the_verifier().verify(blob, x64, timeout)


def _after_fork_in_child() -> None:
    global _VERIFIER, _VERIFIER_LOCK, _VERDICTS_LOCK
    _VERIFIER_LOCK = threading.Lock()  # a thread of the parent may have held them
    _VERDICTS_LOCK = threading.Lock()
    if _VERIFIER is not None:
        _VERIFIER.abandon()
        _VERIFIER = None


@atexit.register
def _close_verifier() -> None:
    verifier = _VERIFIER
    if verifier is not None and verifier.owner == os.getpid():
        verifier.close()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def verify_program(
    blob: bytes, meta: Mapping[str, Any], where: str, timeout: float | None = None
) -> None:
    """Deserialize, parse and lower the program part ``blob`` in the verifying child process.

    Only after this returns may this process deserialize ``blob``. Verdicts
    are kept by the sha256 of ``blob``; the child is started at the first
    call and reused (see the module docstring).

    Args:
        blob: the program part (``jax.export`` serialized), digests verified.
        meta: the file's (checked) metadata, for the versions in messages.
        where: the file, for messages.
        timeout: seconds the child may take (its start included, when there is
            none yet); None: :func:`verify_timeout`'s default.

    Raises:
        ProgramFileError: the program could not be verified within the time
            limit, the child died, or JAX cannot read or lower the program.
        IncompatibleVersionError: another jax wrote the program and this one
            cannot deserialize it.
        ValueError: ``timeout`` is not a positive number of seconds.
    """
    limit = verify_timeout(timeout)
    x64 = bool(jax.config.read("jax_enable_x64"))
    key = (hashlib.sha256(blob).hexdigest(), x64)
    verdict = _VERDICTS.get(key)
    if verdict is None:
        verdict = _child_verdict(blob, x64, limit)
        if verdict[0] not in _UNKEPT:
            with _VERDICTS_LOCK:
                while len(_VERDICTS) >= _MAX_VERDICTS:
                    del _VERDICTS[next(iter(_VERDICTS))]
                _VERDICTS[key] = verdict
    stage, error = verdict
    if stage == "verified":
        return
    advice = "It was rewritten or damaged; save the program again with jm.jit.save."
    if stage == "timeout":
        raise ProgramFileError(
            f"{where}: its program could not be verified in {limit:g} seconds (JAX's StableHLO "
            "reader, run in a child process, had not finished and was stopped). Programs "
            "jm.jit.save writes are verified in seconds; this one was probably rewritten to "
            "stall the reader. For a large program you trust, allow more time: "
            f"jm.jit.load(f, verify_timeout=seconds) or {VERIFY_TIMEOUT_ENV}=seconds."
        )
    if stage == "start":
        raise ProgramFileError(
            f"{where}: its program could not be verified: a child Python process could not "
            f"start JAX ({error[:300]}). jm.jit.load verifies programs in a child "
            f"({sys.executable!r}, this process's sys.path), which must be able to import jax."
        )
    if stage in _UNKEPT:
        raise ProgramFileError(
            f"{where}: its program could not be verified: the child process reading it gave no "
            f"verdict: {error}. {advice}"
        )
    saved_jax = meta.get("jax_version", "?")
    if stage == "deserialize" and saved_jax != jax.__version__:
        raise IncompatibleVersionError(
            f"{where}: this jax ({jax.__version__}) cannot deserialize the program written "
            f"with jax {saved_jax}: {error[:300]}"
        )
    raise ProgramFileError(
        f"{where} does not match its header: the program cannot be read ({stage}: "
        f"{error[:300]}). {advice}"
    )
