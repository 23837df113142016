"""The DaemonSet's container image (deploy/container/) without a container engine.

Checks that the Containerfile installs a Debian package for every shared library the binaries
load, runs as the non-root user the DaemonSet names, and that the ConfigMap's socket group
reaches the pod and the training-pod example. Then runs the entrypoint from the image's file
layout (usr/local/bin/{offloadd,offloadctl,offloadd-entrypoint}, the ConfigMap at
etc/offloadd/offloadd.conf) outside a container: with the ConfigMap as is, on a host that
cannot run it (no CUDA driver here, or a pool beyond MemAvailable), it exits 1 before starting
the daemon; with backend shm and a small pool it starts the daemon as uid 10001, the socket
belongs to the socket group with mode 0660, a member of that group gets SERVING from the probe
and a non-member is refused. The uid parts need root (setpriv); they are skipped otherwise.
Run: /usr/bin/python3 -m unittest test_container (from tests/monitoring).
"""
import os
import re
import shutil
import stat
import subprocess
import sys
import time
import unittest

import yaml

import common

CONTAINER = os.path.join(common.DEPLOY, "container")
CONTAINERFILE = os.path.join(CONTAINER, "Containerfile")
ENTRYPOINT = os.path.join(CONTAINER, "entrypoint.sh")
K8S = os.path.join(common.DEPLOY, "k8s")
# Libraries that come from elsewhere than the Containerfile's apt-get: glibc and the compiler
# runtime (in the base image), the CUDA runtime (copied from the toolkit), the driver.
NOT_FROM_APT = re.compile(r"^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|"
                          r"librt\.so|libstdc\+\+\.so|libgcc_s\.so|libcudart\.so|libcuda\.so)")


def k8s():
    docs = []
    for name in ("daemonset.yaml", "configmap.yaml"):
        with open(os.path.join(K8S, name)) as f:
            docs += [d for d in yaml.safe_load_all(f) if d]
    ds = [d for d in docs if d.get("kind") == "DaemonSet"][0]
    cm = [d for d in docs if d.get("kind") == "ConfigMap"][0]
    return ds, cm


def apt_packages():
    text = common.read_text(CONTAINERFILE)
    m = re.search(r"apt-get install[^\n]*\\\n(.*?)&&", text, re.S)
    assert m, "no apt-get install in the Containerfile"
    return set(re.findall(r"[a-z0-9][a-z0-9+.-]+", m.group(1).replace("\\", " ")))


# Packages debian:bookworm-slim has already (dpkg itself needs them).
IN_BASE_IMAGE = {"libc6", "zlib1g", "liblzma5", "libgcc-s1", "libstdc++6"}


def owner(path):
    """The Debian package holding `path` ("?" if none), under /lib or /usr/lib (usrmerge)."""
    alt = path[4:] if path.startswith("/usr/") else "/usr" + path
    for p in (path, alt):
        r = subprocess.run(["dpkg", "-S", p], capture_output=True, text=True)
        if r.returncode == 0:
            return r.stdout.split(":")[0]
    return "?"


def is_root():
    return os.geteuid() == 0 and shutil.which("setpriv") is not None


class ContainerfileTest(unittest.TestCase):
    def test_debian_base_non_root_user_and_entrypoint(self):
        text = common.read_text(CONTAINERFILE)
        self.assertRegex(text, r"(?m)^FROM \S*debian:bookworm")
        user = re.search(r"(?m)^USER (\d+):(\d+)$", text)
        self.assertTrue(user, "the image must name a numeric non-root USER")
        self.assertNotEqual(user.group(1), "0")
        self.assertIn('ENTRYPOINT ["/usr/local/bin/offloadd-entrypoint"]', text)
        self.assertIn("setcap cap_ipc_lock+p /usr/local/bin/offloadd", text)
        ds, _ = k8s()
        pod = ds["spec"]["template"]["spec"]
        self.assertEqual(str(pod["securityContext"]["runAsUser"]), user.group(1))
        self.assertEqual(str(pod["securityContext"]["runAsGroup"]), user.group(2))

    @unittest.skipUnless(shutil.which("dpkg"), "needs dpkg to map libraries to packages")
    def test_every_shared_library_comes_from_a_listed_package(self):
        wanted = apt_packages()
        missing = {}
        for b in ("offloadd", "offloadctl"):
            out = subprocess.run(["ldd", common.binary(b)], capture_output=True, text=True).stdout
            for name, path in re.findall(r"^\s*(\S+) => (/\S+)", out, re.M):
                if NOT_FROM_APT.match(name):
                    continue
                pkg = owner(os.path.realpath(path))
                if pkg not in wanted and pkg not in IN_BASE_IMAGE:
                    missing[name] = pkg
        # dlopened by the projector (server/projector/blas.cc)
        for pkg in ("libopenblas0-pthread", "liblapacke"):
            if pkg not in wanted:
                missing[pkg] = pkg
        self.assertEqual(missing, {}, "libraries whose package the Containerfile lacks")

    def test_socket_group_reaches_the_pods(self):
        ds, cm = k8s()
        conf = cm["data"]["offloadd.conf"]
        group = re.search(r'(?m)^\s*socket_group:\s*"(\d+)"', conf)
        self.assertTrue(group, "the ConfigMap must set a numeric socket_group")
        gid = int(group.group(1))
        pod = ds["spec"]["template"]["spec"]
        self.assertIn(gid, pod["securityContext"].get("supplementalGroups", []))
        init = [c for c in pod.get("initContainers", []) if c["name"] == "socket-dir"][0]
        self.assertEqual(init["command"][1:], ["prepare-socket-dir", "/run/offloadd",
                                               str(pod["securityContext"]["runAsUser"]),
                                               str(gid)])
        readme = common.read_text(os.path.join(common.DEPLOY, "README.md"))
        blocks = re.findall(r"```yaml\n(.*?)```", readme, re.S)
        pods = [d for b in blocks for d in yaml.safe_load_all(b) if d and d.get("kind") == "Pod"]
        self.assertIn(gid, pods[0]["spec"].get("securityContext", {}).get("supplementalGroups",
                                                                            []),
                      "the training-pod example must join the socket group")


class EntrypointTest(unittest.TestCase):
    """The entrypoint from the image's layout, outside a container."""

    def setUp(self):
        self.tmp = common.short_tmpdir("ofct")
        os.chmod(self.tmp, 0o755)
        self.root = os.path.join(self.tmp, "rootfs")
        bin_dir = os.path.join(self.root, "usr", "local", "bin")
        os.makedirs(bin_dir)
        os.makedirs(os.path.join(self.root, "etc", "offloadd"))
        for b in ("offloadd", "offloadctl"):
            shutil.copy(common.binary(b), bin_dir)
        shutil.copy(ENTRYPOINT, os.path.join(bin_dir, "offloadd-entrypoint"))
        self.entry = os.path.join(bin_dir, "offloadd-entrypoint")
        self.ctl = os.path.join(bin_dir, "offloadctl")
        ds, cm = k8s()
        self.conf_text = cm["data"]["offloadd.conf"]
        self.container = [c for c in ds["spec"]["template"]["spec"]["containers"]
                          if c["name"] == "offloadd"][0]
        self.sock_dir = os.path.join(self.tmp, "run")
        self.sock = os.path.join(self.sock_dir, "offloadd.sock")
        self.daemon = None

    def tearDown(self):
        if self.daemon and self.daemon.poll() is None:
            self.daemon.terminate()
            self.daemon.wait(timeout=30)
        shutil.rmtree(self.tmp)
        if getattr(self, "pool", None):
            try:
                os.unlink("/dev/shm/" + self.pool)
            except OSError:
                pass

    def write_conf(self, text):
        path = os.path.join(self.root, "etc", "offloadd", "offloadd.conf")
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o644)
        return path

    def args(self):
        """The container's flags, with the socket and metrics moved to this test's."""
        out = []
        for a in self.container["args"]:
            if a.startswith("--socket_path="):
                a = "--socket_path=" + self.sock
            elif a.startswith("--metrics_address="):
                a = "--metrics_address="
            elif a.startswith("--config="):
                continue  # the entrypoint passes --config itself
            out.append(a)
        return out

    def test_refuses_a_host_that_cannot_run_the_configmap(self):
        conf = self.write_conf(self.conf_text)
        r = subprocess.run([self.entry] + self.args(), capture_output=True, text=True,
                           timeout=30, env=dict(os.environ, OFFLOADD_CONFIG=conf))
        if r.returncode == 0:
            self.skipTest("this host can run the ConfigMap (driver and RAM present)")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("is valid, but this host cannot run it", r.stderr)
        self.assertFalse(os.path.exists(self.sock), "the daemon must not start")

    def test_missing_config_says_where_to_mount_it(self):
        r = subprocess.run([self.entry], capture_output=True, text=True, timeout=30,
                           env=dict(os.environ, OFFLOADD_CONFIG=os.path.join(self.tmp, "none")))
        self.assertEqual(r.returncode, 2)
        self.assertIn("mount the ConfigMap there", r.stderr)

    @unittest.skipUnless(is_root(), "needs root to act as the image's users (setpriv)")
    def test_non_root_daemon_and_socket_group(self):
        gid = int(re.search(r'socket_group:\s*"(\d+)"', self.conf_text).group(1))
        r = subprocess.run([self.entry, "prepare-socket-dir", self.sock_dir, "10001", str(gid)],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        st = os.stat(self.sock_dir)
        self.assertEqual((st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)), (10001, gid, 0o750))
        text = re.sub(r'(?m)^(\s*)backend:.*$', r'\1backend: "shm"', self.conf_text)
        text = re.sub(r'(?m)^(\s*)pool_bytes:.*$', r'\1pool_bytes: 16MiB', text)
        text = re.sub(r'(?m)^(\s*)pool_mlock:.*$', r'\1pool_mlock: false', text)
        # A pool object of this test's own, removed afterwards (not the node's offloadd-pool).
        self.pool = "offloadd-ct-%d" % os.getpid()
        text = re.sub(r'(?m)^(\s*)pool_shm_name:.*$', r'\1pool_shm_name: "%s"' % self.pool, text)
        conf = self.write_conf(text)
        as_daemon = ["setpriv", "--reuid=10001", "--regid=10001", "--groups=%d" % gid]
        self.daemon = subprocess.Popen(as_daemon + [self.entry] + self.args(),
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                       env=dict(os.environ, OFFLOADD_CONFIG=conf))
        for _ in range(200):
            if os.path.exists(self.sock) or self.daemon.poll() is not None:
                break
            time.sleep(0.05)
        self.assertTrue(os.path.exists(self.sock), self.daemon.stderr.read()
                        if self.daemon.poll() is not None else "no socket")
        st = os.stat(self.sock)
        self.assertEqual((st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)), (10001, gid, 0o660))
        probe = [self.ctl, "--socket", self.sock, "health"]
        member = subprocess.run(["setpriv", "--reuid=10002", "--regid=10002",
                                 "--groups=%d" % gid] + probe,
                                capture_output=True, text=True, timeout=30)
        self.assertEqual(member.returncode, 0, member.stdout + member.stderr)
        self.assertIn("SERVING", member.stdout)
        outsider = subprocess.run(["setpriv", "--reuid=10003", "--regid=10003",
                                   "--clear-groups"] + probe,
                                  capture_output=True, text=True, timeout=30)
        self.assertNotEqual(outsider.returncode, 0, "a user outside the socket group got in")


if __name__ == "__main__":
    unittest.main()


class InstallTest(unittest.TestCase):
    """`make install PREFIX=... DESTDIR=...` (deploy/install.sh) into a temporary folder."""

    def test_binaries_unit_and_its_documentation(self):
        tmp = common.short_tmpdir("ofin")
        try:
            prefix = "/opt/offloadd-test"
            r = subprocess.run(["bash", os.path.join(common.DEPLOY, "install.sh"), "--bin",
                                common.bin_dir(), prefix, tmp],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            root = tmp + prefix
            for b in ("offloadd", "offloadctl"):
                path = os.path.join(root, "bin", b)
                self.assertTrue(os.access(path, os.X_OK), path)
            v = subprocess.run([os.path.join(root, "bin", "offloadd"), "--version"],
                               capture_output=True, text=True, timeout=20)
            self.assertRegex(v.stdout, r"^offloadd \d+\.\d+\.\d+")
            unit = common.read_text(os.path.join(root, "lib", "systemd", "system",
                                                 "offloadd.service"))
            settings = "\n".join(l for l in unit.splitlines() if not l.startswith("#"))
            self.assertNotIn("/usr/local", settings, "unit paths not rewritten to the prefix")
            execs = re.findall(r"(?m)^ExecStart(?:Pre)?=(\S+)", unit)
            self.assertEqual(execs, [prefix + "/bin/offloadd"] * 2)
            docs = re.findall(r"(?m)^Documentation=file://(\S+)", unit)
            self.assertTrue(docs, "the unit names no file:// documentation")
            for doc in docs:
                self.assertTrue(os.path.isfile(tmp + doc), doc + " not installed")
            # The README as it is, and every page it links at its source-tree path beside it:
            # every relative link of the installed pages resolves (tests/md_links.py).
            readme = common.read_text(os.path.join(common.REPO, "README.md"))
            self.assertEqual(common.read_text(tmp + docs[0]), readme)
            docdir = os.path.dirname(tmp + docs[0])
            pages = sorted(os.path.join(d, f) for d, _, files in os.walk(docdir)
                           for f in files if f.endswith(".md"))
            for page in ("docs/ARCHITECTURE.md", "deploy/README.md", "BENCHMARKS.md",
                         "docs/benchmarks/gpu.md", "server/copy/cuda/README.md"):
                self.assertIn(os.path.join(docdir, page), pages)
            # The dashboard, alerts and scrape configs the pages name, at their source-tree paths.
            for f in ("monitoring/grafana/offloadd-dashboard.json",
                      "monitoring/prometheus/alerts.yml", "monitoring/prometheus/prometheus.yml",
                      "monitoring/prometheus/prometheus-kubernetes.yml"):
                self.assertEqual(common.read_text(os.path.join(docdir, f)),
                                 common.read_text(os.path.join(common.REPO, f)), f)
            links = subprocess.run([sys.executable, os.path.join(common.REPO, "tests",
                                                                 "md_links.py")] + pages,
                                   capture_output=True, text=True, timeout=60)
            self.assertEqual(links.returncode, 0, links.stdout)
            self.assertTrue(links.stdout.endswith("%d passed, 0 failed\n" % len(pages)),
                            links.stdout)
        finally:
            shutil.rmtree(tmp)

    def test_advice_names_what_systemd_reads(self):
        tmp = common.short_tmpdir("ofia")
        try:
            for prefix, want in (("/usr/local", "next: systemctl daemon-reload (systemd reads "
                                                "/usr/local/lib/systemd/system)"),
                                 ("/opt/offloadd", "next: systemd does not read /opt/offloadd/"
                                                   "lib/systemd/system: link the units with "
                                                   "'systemctl link /opt/offloadd/lib/systemd/"
                                                   "system/offloadd.service'")):
                r = subprocess.run(["bash", os.path.join(common.DEPLOY, "install.sh"), "--bin",
                                    common.bin_dir(), prefix, tmp],
                                   capture_output=True, text=True, timeout=60)
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                self.assertIn(want, r.stdout)
        finally:
            shutil.rmtree(tmp)

    def test_make_install_builds_nothing(self):
        # `sudo make install` must not run apt, pip or Bazel as root: no prerequisites.
        text = common.read_text(os.path.join(common.REPO, "Makefile"))
        rule = re.search(r"(?m)^install:(.*)$", text)
        self.assertTrue(rule, "no install rule in the Makefile")
        self.assertEqual(rule.group(1).strip(), "", "install depends on %s" % rule.group(1))
        tmp = common.short_tmpdir("ofib")
        try:
            r = subprocess.run(["bash", os.path.join(common.DEPLOY, "install.sh"), "--bin",
                                os.path.join(tmp, "none"), "/usr/local", tmp],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 1)
            self.assertIn("run 'make build' as yourself first (not as root)", r.stderr)
        finally:
            shutil.rmtree(tmp)

    def test_relative_prefix_is_refused(self):
        r = subprocess.run(["bash", os.path.join(common.DEPLOY, "install.sh"), "usr/local"],
                           capture_output=True, text=True, timeout=20)
        self.assertEqual(r.returncode, 2)
        self.assertIn("absolute path", r.stderr)
