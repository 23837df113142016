"""deploy/offloadd.service and offloadd.socket under a real systemd.

systemd 252 (Debian bookworm) runs as PID 1 of new PID, mount and cgroup namespaces, chrooted
into an overlay of a cached debootstrap rootfs (rootfs.sh, boot.sh); systemctl and journalctl
reach it through nsenter. `make install DESTDIR=...` puts the build's binaries and units in
/usr/local as an operator's install would; the group offloadd, a member (alice) and an outsider
(bob) are made as deploy/README.md says. The checks, in order, on one booted system:
  1. `systemctl start` returns once the daemon serves (Type=notify: the health check answers at
     once, systemd shows the daemon's STATUS), with the socket made by the daemon (socket
     activation off: offloadd.socket stays inactive), mode 0660, group offloadd;
  2. a member of offloadd reaches it at the default socket path; an outsider gets one error in
     under 1 s naming /run/offloadd, its group and the remedy;
  3. a SIGKILL with a 256 MiB shared pool holding 192 MiB of blocks, MemAvailable shown as half
     the pool: systemd restarts the unit, ExecStartPre's --check-config passes, and a client
     that kept its session gets every block back bit-exact;
  4. `systemctl stop`: SIGTERM, a clean exit;
  5. socket activation on: a connect starts the service; `systemctl stop offloadd` alone is
     undone by the next connect, stopping the socket unit too keeps it down;
  6. spill_directory under ProtectSystem=strict: /var/lib/offloadd (StateDirectory) works; another
     directory makes ExecStartPre name it read-only with the ReadWritePaths= fix, and works with
     that drop-in.
Needs root; run.sh skips the suite otherwise. Run: bash tests/systemd/run.sh
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "client", "python"))

from offloadd.client import URGENT, Client  # noqa: E402
from offloadd.shm import ShmRegion  # noqa: E402

BIN = os.environ.get("OFFLOADD_BIN_DIR", os.path.join(REPO, "build", "bin"))
ROOTFS = os.environ.get("OFFLOADD_TEST_ROOTFS", "")
SOCKET = "/run/offloadd/offloadd.sock"
POOL_BYTES = 256 << 20
BLOCK_BYTES = 4 << 20
BLOCKS = 48  # 192 MiB of the pool


class BootedSystem:
    """systemd as PID 1 over an overlay of ROOTFS; ``pid`` is its pid on the host."""

    def __init__(self, rootfs):
        self.work = tempfile.mkdtemp(prefix="ofd-systemd-", dir="/var/tmp")
        for d in ("upper", "work", "merged"):
            os.mkdir(os.path.join(self.work, d))
        upper = os.path.join(self.work, "upper")
        subprocess.run(["bash", os.path.join(REPO, "deploy", "install.sh"), "--bin", BIN,
                        "/usr/local", upper], check=True, capture_output=True)
        self.copy_cuda_runtime(upper)
        self.cgroup = "/sys/fs/cgroup/systemd/offloadd-test-%d" % os.getpid()
        os.makedirs(self.cgroup, exist_ok=True)
        self.log = open(os.path.join(self.work, "console.log"), "w")
        self.proc = subprocess.Popen(
            ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec unshare --pid --fork --mount '
             '--cgroup --propagation private bash "$1" "$2" "$3"', self.cgroup,
             os.path.join(HERE, "boot.sh"), rootfs, self.work],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.pid = self.find_init()
        self.root = "/proc/%d/root" % self.pid
        self.wait_running()

    @staticmethod
    def copy_cuda_runtime(upper):
        """The CUDA runtime a cuda build links, where its rpath looks (as build-image.sh)."""
        out = subprocess.run(["ldd", os.path.join(BIN, "offloadd")], capture_output=True,
                             text=True).stdout
        m = re.search(r"(libcudart\S*) => (\S+)", out)
        if m:
            dst = os.path.join(upper, "usr", "local", "cuda", "lib64")
            os.makedirs(dst)
            shutil.copy(os.path.realpath(m.group(2)), os.path.join(dst, m.group(1)))

    def find_init(self):
        """The host pid of the namespace's PID 1 (the child of unshare --fork)."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            r = subprocess.run(["pgrep", "-P", str(self.proc.pid), "-x", "unshare"],
                               capture_output=True, text=True)
            unshare = r.stdout.split()
            parent = unshare[0] if unshare else str(self.proc.pid)
            r = subprocess.run(["pgrep", "-P", parent], capture_output=True, text=True)
            for pid in r.stdout.split():
                try:
                    if os.readlink("/proc/%s/exe" % pid).endswith("/systemd"):
                        return int(pid)
                except OSError:
                    pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError("systemd did not start: %s" % self.console())

    def console(self):
        with open(os.path.join(self.work, "console.log")) as f:
            return f.read()[-3000:]

    def run(self, *cmd, user=None, groups=None, check=False, timeout=120):
        """A command in the booted system (its namespaces and root); as ``user`` via setpriv."""
        prefix = ["nsenter", "-t", str(self.pid), "-m", "-p", "-r", "-w", "--"]
        if user is not None:
            prefix += ["setpriv", "--reuid=" + user, "--regid=" + user,
                       "--groups=" + groups if groups else "--clear-groups"]
        r = subprocess.run(prefix + list(cmd), capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError("%s: exit %d\n%s%s" % (" ".join(cmd), r.returncode, r.stdout,
                                                        r.stderr))
        return r

    def systemctl(self, *args, check=False):
        return self.run("systemctl", *args, check=check)

    def show(self, unit, prop):
        return self.systemctl("show", "-p", prop, "--value", unit).stdout.strip()

    def journal(self, unit):
        return self.run("journalctl", "-u", unit, "--no-pager", "-o", "cat").stdout

    def wait_running(self, timeout=60):
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.run("systemctl", "is-system-running").stdout.strip()
            if state in ("running", "degraded"):
                return state
            time.sleep(0.2)
        raise RuntimeError("systemd is %r after %d s: %s" % (state, timeout, self.console()))

    def write(self, path, text, mode=0o644):
        full = self.root + path
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            f.write(text)
        os.chmod(full, mode)

    def shutdown(self):
        try:
            os.kill(self.pid, signal.SIGKILL)  # PID 1 of the namespace: takes everything along
        except ProcessLookupError:
            pass
        self.proc.wait(30)
        self.log.close()
        for d, _, _ in sorted(os.walk(self.cgroup), key=lambda w: -len(w[0])):
            try:
                os.rmdir(d)
            except OSError:
                pass
        shutil.rmtree(self.work, ignore_errors=True)


@unittest.skipUnless(os.geteuid() == 0 and ROOTFS, "needs root and OFFLOADD_TEST_ROOTFS "
                     "(tests/systemd/run.sh sets it)")
class SystemdUnitTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        t0 = time.monotonic()
        cls.sys = BootedSystem(ROOTFS)
        cls.boot_seconds = time.monotonic() - t0
        cls.pool = "offloadd-systemd-test-%d" % os.getpid()
        s = cls.sys
        s.run("groupadd", "--system", "offloadd", check=True)
        s.run("useradd", "--no-create-home", "--groups", "offloadd", "alice", check=True)
        s.run("useradd", "--no-create-home", "bob", check=True)
        cls.gid = int(s.run("getent", "group", "offloadd").stdout.split(":")[2])
        cls.write_config()

    @classmethod
    def tearDownClass(cls):
        cls.sys.shutdown()
        try:
            os.unlink("/dev/shm/" + cls.pool)
        except OSError:
            pass

    @classmethod
    def write_config(cls, extra=""):
        cls.sys.write("/etc/offloadd/offloadd.conf", (
            'backend: "shm"\npool_bytes: %d\npool_shm_name: "%s"\nresume_grace_seconds: 120\n'
            'socket_mode: 0660\nsocket_group: "offloadd"\nmetrics_address: ""\n%s'
            % (POOL_BYTES, cls.pool, extra)))

    def health(self, user=None, groups=None):
        t0 = time.monotonic()
        r = self.sys.run("/usr/local/bin/offloadctl", "health", user=user, groups=groups)
        return r, time.monotonic() - t0

    def start(self, unit="offloadd"):
        r = self.sys.systemctl("start", unit)
        self.assertEqual(r.returncode, 0, r.stderr + self.sys.journal("offloadd"))

    def test_1_start_returns_once_the_daemon_serves(self):
        s = self.sys
        self.assertEqual(s.show("offloadd.service", "Type"), "notify")
        self.start()
        r, _ = self.health()  # at once: start returned, so the daemon serves
        self.assertEqual((r.returncode, r.stdout), (0, "SERVING\n"), r.stderr)
        self.assertEqual(s.show("offloadd.service", "ActiveState"), "active")
        status = s.show("offloadd.service", "StatusText")
        self.assertTrue(status.startswith("serving on %s: pool 256 MiB, backend shm" % SOCKET),
                        status)
        self.assertIn("mapping and pre-faulting the pool", s.journal("offloadd"))
        # Socket activation is off: the daemon made the socket, from socket_mode/socket_group.
        self.assertEqual(s.show("offloadd.socket", "ActiveState"), "inactive")
        st = os.stat(s.root + SOCKET)
        self.assertEqual((st.st_mode & 0o777, st.st_gid), (0o660, self.gid))

    def test_2_member_and_outsider_of_the_socket_group(self):
        r, _ = self.health(user="alice", groups=str(self.gid))
        self.assertEqual((r.returncode, r.stdout), (0, "SERVING\n"), r.stderr)
        r, seconds = self.health(user="bob")
        self.assertEqual(r.returncode, 1)
        self.assertLess(seconds, 1.0)
        self.assertIn("its directory /run/offloadd (group offloadd (gid %d), mode 0750)" % self.gid,
                      r.stderr)
        self.assertIn("usermod -aG offloadd USER", r.stderr)
        self.assertIn("do not restart it", r.stderr)

    def test_3_sigkill_with_a_large_shared_pool_loses_nothing(self):
        s = self.sys
        client = Client(s.root + SOCKET, "systemd-test", "cpu", reconnect=True)
        src = ShmRegion(BLOCKS * BLOCK_BYTES)
        dst = ShmRegion(BLOCKS * BLOCK_BYTES)
        self.addCleanup(src.close)
        self.addCleanup(dst.close)
        sid = client.register_shm(src.name, src.size_bytes, relink=src.relink)
        did = client.register_shm(dst.name, dst.size_bytes, relink=dst.relink)
        payloads = [os.urandom(BLOCK_BYTES) for _ in range(BLOCKS)]
        for i, p in enumerate(payloads):
            src.mm[i * BLOCK_BYTES:(i + 1) * BLOCK_BYTES] = p
        ids = [client.offload(sid, i * BLOCK_BYTES, BLOCK_BYTES).result(60).block_id
               for i in range(BLOCKS)]
        # The host as the restart sees it: the pool object holds its memory, MemAvailable is
        # half the pool (a bind mount over /proc/meminfo in systemd's mount namespace, which
        # the unit's own namespace inherits).
        with open("/proc/meminfo") as f:
            fake = re.sub(r"(?m)^MemAvailable:\s+\d+ kB$",
                          "MemAvailable:   %d kB" % (POOL_BYTES // 2 // 1024), f.read())
        s.write("/meminfo-small", fake)
        s.run("mount", "--bind", "/meminfo-small", "/proc/meminfo", check=True)
        self.addCleanup(s.run, "umount", "/proc/meminfo")
        restarts = int(s.show("offloadd.service", "NRestarts"))
        s.systemctl("kill", "--signal=SIGKILL", "offloadd", check=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if int(s.show("offloadd.service", "NRestarts")) > restarts and \
                    s.show("offloadd.service", "ActiveState") == "active":
                break
            time.sleep(0.2)
        journal = s.journal("offloadd")
        self.assertEqual(s.show("offloadd.service", "ActiveState"), "active", journal[-3000:])
        self.assertIn("status=9/KILL", journal)
        self.assertIn("/etc/offloadd/offloadd.conf with --socket_path=/run/offloadd/offloadd.sock "
                      "from the command line is valid and this host can run it",
                      journal.split("status=9/KILL")[-1], "ExecStartPre of the restart")
        self.assertNotIn("Lower the pool size", journal)
        for i, bid in enumerate(ids):
            client.reload(bid, did, i * BLOCK_BYTES, URGENT, release_after=True).result(60)
        for i, p in enumerate(payloads):
            self.assertEqual(bytes(dst.mm[i * BLOCK_BYTES:(i + 1) * BLOCK_BYTES]), p,
                             "block %d changed across the restart" % i)
        self.assertGreaterEqual(client.counters.resumes, 1)
        client.close()

    def test_4_stop_is_a_clean_sigterm_exit(self):
        s = self.sys
        s.systemctl("stop", "offloadd", check=True)
        self.assertEqual(s.show("offloadd.service", "ActiveState"), "inactive")
        self.assertEqual(s.show("offloadd.service", "Result"), "success")
        self.assertIn("offloadd stopped cleanly", s.journal("offloadd"))

    def test_5_socket_activation_when_enabled(self):
        s = self.sys
        s.systemctl("enable", "--now", "offloadd.socket", check=True)
        try:
            self.assertEqual(s.show("offloadd.service", "ActiveState"), "inactive")
            r, _ = self.health(user="alice", groups=str(self.gid))  # the connect starts it
            self.assertEqual(r.stdout, "SERVING\n", r.stderr + s.journal("offloadd")[-2000:])
            self.assertEqual(s.show("offloadd.service", "ActiveState"), "active")
            self.assertIn("passed by the service manager", s.journal("offloadd"))
            # Stopping the service alone lasts until the next connect (deploy/README.md).
            s.systemctl("stop", "offloadd.service", check=True)
            r, _ = self.health()
            self.assertEqual(r.stdout, "SERVING\n", r.stderr)
            s.systemctl("stop", "offloadd.socket", "offloadd.service", check=True)
            r, _ = self.health()
            self.assertEqual(r.returncode, 1)
            self.assertEqual(s.show("offloadd.service", "ActiveState"), "inactive")
        finally:
            s.systemctl("disable", "--now", "offloadd.socket")
            s.systemctl("stop", "offloadd.service")
        # Off again: starting the service does not bring the socket unit back.
        self.start()
        self.assertEqual(s.show("offloadd.socket", "ActiveState"), "inactive")
        s.systemctl("stop", "offloadd", check=True)

    def test_6_spill_directory_under_protect_system(self):
        s = self.sys
        spill = ('spill_directory: "%s"\nspill_capacity_bytes: 67108864\n'
                 'spill_bytes_per_second: -1\n')
        try:
            self.write_config(spill % "/var/lib/offloadd/spill")
            self.start()
            self.assertTrue(os.path.isdir(s.root + "/var/lib/offloadd/spill"))
            s.systemctl("stop", "offloadd", check=True)
            s.run("mkdir", "-p", "/srv/offloadd-spill", check=True)
            self.write_config(spill % "/srv/offloadd-spill")
            s.systemctl("reset-failed", "offloadd")
            r = s.systemctl("start", "offloadd")
            self.assertNotEqual(r.returncode, 0, "started with a read-only spill directory")
            journal = s.journal("offloadd")
            self.assertIn("spill_directory /srv/offloadd-spill is on a file system that is "
                          "read-only", journal)
            self.assertIn("ReadWritePaths=/srv/offloadd-spill", journal)
            s.write("/etc/systemd/system/offloadd.service.d/spill.conf",
                    "[Service]\nReadWritePaths=/srv/offloadd-spill\n")
            s.systemctl("daemon-reload", check=True)
            s.systemctl("reset-failed", "offloadd")
            self.start()
            self.assertTrue(os.path.exists(s.root + "/srv/offloadd-spill/offloadd.lock"))
        finally:
            s.systemctl("stop", "offloadd")
            self.write_config()


if __name__ == "__main__":
    unittest.main()
