"""Test helpers: a real offloadd daemon per test class, and one training step of the tiny model.

The daemon binary is $OFFLOADD_BIN, default <repo>/bazel-bin/server/offloadd or another place
a build leaves it (BIN_CANDIDATES; build it with ``bazel build //server:offloadd``). Each daemon
listens on a unique short socket under /tmp (Unix socket paths are limited to 107 bytes), with
--metrics_address "" and a small pool; its log goes to a temporary file that is printed when it
fails to start. The daemon gets SIGTERM when the test process dies (PR_SET_PDEATHSIG).
"""

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import unittest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
PY_ROOT = os.path.join(REPO, "client", "python")
EXAMPLES = os.path.join(PY_ROOT, "examples")
_import_paths = (PY_ROOT, EXAMPLES)
# OFFLOADD_TEST_INSTALLED=1 (tests/python/wheel_suite.sh): the tests import the offloadd installed
# in this Python (from the wheel), never the source tree; PY_ROOT is then the folder holding the
# installed package (site-packages), for tests that start child Pythons with it on sys.path.
if os.environ.get("OFFLOADD_TEST_INSTALLED") == "1":
    import importlib.util
    _spec = importlib.util.find_spec("offloadd")
    if _spec is None or os.path.dirname(os.path.dirname(_spec.origin)) == PY_ROOT:
        raise ImportError("OFFLOADD_TEST_INSTALLED=1 but offloadd is %s, not an installed copy: "
                          "pip install the wheel (make wheel) into %s"
                          % (_spec and _spec.origin, sys.prefix))
    PY_ROOT = os.path.dirname(os.path.dirname(_spec.origin))
    _import_paths = (EXAMPLES,)
for _p in _import_paths:
    if _p not in sys.path:
        sys.path.insert(0, _p)

import ctypes  # noqa: E402

import grpc  # noqa: E402

from offloadd.v1 import offload_pb2 as pb  # noqa: E402
from offloadd.v1 import offload_pb2_grpc as pb_grpc  # noqa: E402


# setpriv (util-linux) sets the parent-death signal and execs the daemon, so the test process
# starts it without running Python between fork and exec: grpcio's fork handlers, in a process
# whose channels are busy, now and then abort such a child before it execs ("Check failed:
# next_worker->state == KICKED"), and the daemon never starts. preexec_fn where it is missing.
_SETPRIV = shutil.which("setpriv")
_DIE_WITH_PARENT = (_SETPRIV, "--pdeathsig", "TERM") if _SETPRIV else ()


def _die_with_parent():
    """prctl(PR_SET_PDEATHSIG, SIGTERM): the daemon stops if the test process is killed."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except OSError:
        pass


# Where a built daemon may be, in order (bazel-bin follows the last build's configuration).
BIN_CANDIDATES = ("bazel-bin/server/offloadd", "build/bin/offloadd",
                  "bazel-out/k8-opt/bin/server/offloadd",
                  "bazel-out/k8-fastbuild/bin/server/offloadd",
                  "bazel-out/k8-dbg/bin/server/offloadd")


def daemon_stats(sock):
    """The Stats of the daemon on socket path ``sock`` via a unary GetStats (no session)."""
    with grpc.insecure_channel("unix:" + sock) as channel:
        return pb_grpc.OffloadStub(channel).GetStats(pb.GetStatsRequest(), timeout=10)


def run_python(code, timeout=120):
    """Runs ``python -c code`` with the repository's package importable; the CompletedProcess
    (text output captured)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([PY_ROOT, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=timeout)


def free_port():
    """A TCP port on 127.0.0.1 free at the time of asking (for metrics or a process group)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def daemon_bin():
    """$OFFLOADD_BIN, else the first executable of BIN_CANDIDATES under the repository."""
    env = os.environ.get("OFFLOADD_BIN")
    paths = [env] if env else [os.path.join(REPO, p) for p in BIN_CANDIDATES]
    for path in paths:
        if os.access(path, os.X_OK):
            return path
    raise RuntimeError("offloadd binary not found (%s): build it (bazel build //server:offloadd)"
                       " or set OFFLOADD_BIN" % ", ".join(paths))


class Daemon:
    """A started daemon. ``sock``: its socket path (``sock``: a given one, e.g. the socket of a
    daemon that was killed, to restart on it); ``prefix``: a command line that execs the daemon
    command appended to it. ``stop()`` sends SIGTERM and waits; ``kill()`` SIGKILLs it."""

    def __init__(self, pool_bytes="64MiB", extra=(), sock=None, prefix=()):
        self.sock = sock or "/tmp/ofd-py-%d-%s.sock" % (os.getpid(), secrets.token_hex(3))
        self.log = tempfile.NamedTemporaryFile(prefix="offloadd-test-", suffix=".log",
                                               delete=False)
        # prefix: a command that execs the daemon (e.g. in a mount namespace), () for none.
        self.proc = subprocess.Popen(
            list(_DIE_WITH_PARENT) + list(prefix) + [
                daemon_bin(), "--socket_path", self.sock, "--pool_bytes", pool_bytes,
                "--metrics_address", ""] + list(extra),
            stdout=subprocess.PIPE, stderr=self.log, text=True,
            preexec_fn=None if _DIE_WITH_PARENT else _die_with_parent)
        ready = threading.Event()

        def watch():
            for line in self.proc.stdout:
                if line.startswith("offloadd: ready on"):
                    ready.set()
        self._watcher = threading.Thread(target=watch, daemon=True)
        self._watcher.start()
        if not ready.wait(30):
            with open(self.log.name) as f:
                text = f.read()
            self.stop()
            raise RuntimeError("offloadd did not start:\n" + text)

    def stats(self):
        """The daemon's Stats via a unary GetStats (no session is opened)."""
        return daemon_stats(self.sock)

    def kill(self):
        """SIGKILL (a crash): the socket file and the shared pool object stay."""
        self.proc.kill()
        self.proc.wait()
        self.stop()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._watcher.join(5)
        if self.proc.stdout is not None and not self.proc.stdout.closed:
            self.proc.stdout.close()
        if not self.log.closed:
            self.log.close()
        try:
            os.unlink(self.log.name)
        except OSError:
            pass


class DaemonTestCase(unittest.TestCase):
    """Starts one daemon for the class; resets the process's offloadd endpoints per test."""

    POOL_BYTES = "64MiB"
    EXTRA = ()

    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon(cls.POOL_BYTES, cls.EXTRA)

    @classmethod
    def tearDownClass(cls):
        from offloadd.torch import _endpoint
        _endpoint.reset_for_tests()
        cls.daemon.stop()

    def setUp(self):
        from offloadd.torch import _endpoint
        _endpoint.reset_for_tests()


# --- the tiny model -------------------------------------------------------------------------
L, B, S, H = 4, 2, 64, 64          # one layer input: 2 * 64 * 64 * 4 = 32 KiB in fp32
LAYER_BYTES = B * S * H * 4
THRESHOLD = 16 << 10               # below the layer input, above every other saved tensor


def run_step(mode, context=None, seed=0, batch_seed=1, layers=L, b=B, s=S, h=H, model=None):
    """One forward+backward of the tiny model: (loss, [param grads]) as detached tensors."""
    import torch
    import tiny_lm
    data = tiny_lm.CharData()
    if model is None:
        model = tiny_lm.make_model(data.vocab, layers, h, 4, seed=seed)
    model.zero_grad(set_to_none=True)
    idx, tgt = data.batch(b, s, torch.Generator().manual_seed(batch_seed))
    loss = model(idx, tgt, mode, context)
    loss.backward()
    return loss.detach(), [p.grad.detach().clone() for p in model.parameters()]


def bitwise_equal(a, b):
    """True when both (loss, grads) results are bitwise identical."""
    import torch
    return torch.equal(a[0], b[0]) and len(a[1]) == len(b[1]) and \
        all(torch.equal(x, y) for x, y in zip(a[1], b[1]))


def record_offloaded_shapes(context):
    """Wraps the context's pack hook (and those its store gives later); returns the list it
    appends the shape of every tensor the store took for offload (not those left in place)
    to."""
    from offloadd.torch._store import Saved
    from qwen3_fixture import wrap_packs
    shapes = []

    def wrap(pack):
        def spy(t, *a, **k):
            r = pack(t, *a, **k)
            if isinstance(r, Saved):
                shapes.append(tuple(t.shape))
            return r
        return spy
    wrap_packs(context.store, wrap, context)
    return shapes


class InterruptingLock:
    """A store's lock that raises ``error`` once, the first time ``armed()`` is true at its
    point ``at``: "acquire" (before taking the lock: an interrupt while waiting for it) or
    "release" (after letting it go). Otherwise the lock it wraps; ``interrupts`` counts."""

    def __init__(self, lock, at, armed, error=KeyboardInterrupt):
        self.lock, self.at, self.armed, self.error, self.interrupts = lock, at, armed, error, 0

    def _fire(self, point):
        if point == self.at and self.interrupts == 0 and self.armed():
            self.interrupts = 1
            raise self.error("interrupted at the store lock's %s" % point)

    def acquire(self, *args):
        self._fire("acquire")
        return self.lock.acquire(*args)

    def release(self):
        self.lock.release()
        self._fire("release")

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()

    def __getattr__(self, name):
        return getattr(self.lock, name)


@contextlib.contextmanager
def held_by_another_thread(lock):
    """``lock`` held by another thread until the block ends."""
    held, go = threading.Event(), threading.Event()

    def hold():
        with lock:
            held.set()
            go.wait(10)
    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(10)
    try:
        yield
    finally:
        go.set()
        thread.join(10)


def rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0
