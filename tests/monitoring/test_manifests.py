"""Deployment files: the systemd unit, the example config, the Kubernetes manifests, the README.

Checks that the files parse, carry the fields a GPU node needs, and agree with the real binary:
every flag they pass exists in `offloadd --help`, the configs pass `offloadd --check-config`,
and the readiness probe command answers against a live daemon (and fails without one).
Run: /usr/bin/python3 -m unittest test_manifests (from tests/monitoring).
"""
import configparser
import os
import re
import shlex
import shutil
import subprocess
import unittest

import yaml

import common

UNIT = os.path.join(common.DEPLOY, "offloadd.service")
SOCKET_UNIT = os.path.join(common.DEPLOY, "offloadd.socket")
EXAMPLE = os.path.join(common.DEPLOY, "offloadd.conf.example")
K8S = os.path.join(common.DEPLOY, "k8s")
README = os.path.join(common.DEPLOY, "README.md")
CONFIG_PROTO = os.path.join(common.REPO, "proto", "config.proto")


def proto_fields(message):
    """Field names of `message` in proto/config.proto."""
    text = common.read_text(CONFIG_PROTO)
    m = re.search(r"message %s \{(.*?)\n\}" % message, text, re.S)
    assert m, "message %s not found in %s" % (message, CONFIG_PROTO)
    body = re.sub(r"//[^\n]*", "", m.group(1))
    return re.findall(r"^\s*(?:repeated\s+)?[\w.]+\s+(\w+)\s*=\s*\d+\s*;", body, re.M)


def uncomment_examples(text):
    """Uncomments the example blocks ('# links {' ... '# }') of the example config."""
    out, inside = [], False
    for line in text.splitlines():
        if re.match(r"^# (links|gpu_weights) \{$", line):
            inside = True
        if inside:
            line = line[2:] if line.startswith("# ") else line.lstrip("#")
            if line == "}":
                inside = False
        out.append(line)
    return "\n".join(out) + "\n"


def load_k8s_docs():
    docs = []
    for name in ("daemonset.yaml", "configmap.yaml"):
        with open(os.path.join(K8S, name)) as f:
            docs += [d for d in yaml.safe_load_all(f) if d]
    return docs


def check_config(path, flags=()):
    return subprocess.run([common.binary("offloadd"), "--check-config", path] + list(flags),
                          capture_output=True, text=True, timeout=20)


def config_valid(r):
    """Whether `offloadd --check-config` found the config valid: exit 0, or exit 1 when only
    this host cannot run it (a GPU node's config on a machine without the driver or the RAM).
    Exit 2 is an invalid config."""
    return r.returncode == 0 or (r.returncode == 1 and
                                 "is valid, but this host cannot run it" in r.stderr)


def load_unit(path=UNIT):
    p = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",),
                                  comment_prefixes=("#", ";"))
    p.optionxform = str
    p.read(path)
    return p


class SocketUnitTest(unittest.TestCase):
    """deploy/offloadd.socket: one stream socket at the service's --socket_path, kept across
    restarts of the service (socket activation; the daemon takes it through LISTEN_FDS)."""

    def test_listens_where_the_service_serves_and_survives_restarts(self):
        sock = load_unit(SOCKET_UNIT)["Socket"]
        svc_unit = load_unit()
        start = shlex.split(svc_unit["Service"]["ExecStart"])
        path = [a.split("=", 1)[1] for a in start if a.startswith("--socket_path=")][0]
        self.assertEqual(sock.get("ListenStream"), path)
        self.assertEqual(sock.get("Accept"), "no")
        self.assertEqual(sock.get("RemoveOnStop"), "no")
        self.assertEqual(svc_unit["Service"].get("RuntimeDirectoryPreserve"), "yes",
                         "the service's RuntimeDirectory would remove the socket at stop")
        # Optional: starting the service must not start the socket unit (then socket_mode and
        # socket_group would be ignored and a stop undone by the next connect).
        for key in ("Wants", "Requires", "BindsTo", "Requisite"):
            self.assertNotIn("offloadd.socket", svc_unit["Unit"].get(key, ""), key)
        self.assertIn("offloadd.socket", svc_unit["Unit"].get("After", ""))

    @unittest.skipUnless(shutil.which("systemd-analyze"), "systemd-analyze not installed")
    def test_systemd_analyze_verify(self):
        tmp = common.short_tmpdir("ofms")
        try:
            text = common.read_text(UNIT).replace("/usr/local/bin/offloadd", common.binary("offloadd"))
            with open(os.path.join(tmp, "offloadd.service"), "w") as f:
                f.write(text)
            shutil.copy(SOCKET_UNIT, os.path.join(tmp, "offloadd.socket"))
            r = subprocess.run(["systemd-analyze", "verify", os.path.join(tmp, "offloadd.socket")],
                               capture_output=True, text=True, timeout=60)
            ours = [l for l in (r.stdout + r.stderr).splitlines() if "offloadd.s" in l]
            self.assertEqual(ours, [], "systemd-analyze verify complains about the units")
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        finally:
            shutil.rmtree(tmp)


class SystemdUnitTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.unit = load_unit()
        cls.svc = cls.unit["Service"]
        cls.help_flags, _ = common.help_flags(common.binary("offloadd"))

    def test_required_keys(self):
        svc = self.svc
        self.assertEqual(svc.get("RuntimeDirectory"), "offloadd")
        self.assertEqual(svc.get("LimitMEMLOCK"), "infinity")
        self.assertIn(svc.get("Restart"), ("on-failure", "always"))
        self.assertIn("--check-config", svc.get("ExecStartPre", ""))
        self.assertIn("WantedBy", self.unit["Install"])
        for key in ("NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp"):
            self.assertIn(key, svc, "hardening option %s missing" % key)
        # Active only once the daemon serves: it sends READY=1 (sd_notify) itself.
        self.assertEqual(svc.get("Type"), "notify")
        self.assertEqual(svc.get("NotifyAccess"), "main")

    def test_example_spill_directory_writable_under_protect_system(self):
        # ProtectSystem=strict makes every path read-only but those the unit names: the
        # example's spill_directory must be under one (StateDirectory= or ReadWritePaths=).
        self.assertEqual(self.svc.get("ProtectSystem"), "strict")
        example = re.search(r'(?m)^# spill_directory: "([^"]+)"', common.read_text(EXAMPLE))
        spill = example.group(1)
        writable = ["/var/lib/" + d for d in self.svc.get("StateDirectory", "").split()]
        writable += [p.lstrip("-") for p in self.svc.get("ReadWritePaths", "").split()]
        self.assertTrue(any(spill == w or spill.startswith(w + "/") for w in writable),
                        "spill_directory %s is read-only under the unit (%s)" % (spill, writable))

    @unittest.skipUnless(os.geteuid() == 0 and shutil.which("unshare"),
                         "needs root for a read-only bind mount (unshare --mount)")
    def test_check_config_names_a_read_only_spill_directory(self):
        tmp = common.short_tmpdir("ofmr")
        try:
            conf = os.path.join(tmp, "offloadd.conf")
            spill = os.path.join(tmp, "ro", "spill")
            os.makedirs(spill)
            with open(conf, "w") as f:
                f.write('backend: "shm"\npool_bytes: 16777216\nspill_directory: "%s"\n' % spill)
            # What ProtectSystem=strict does to a path the unit does not list: read-only.
            script = ('mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && '
                      'exec "$2" --check-config "$3" --socket_path="$4"')
            r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                                script, "sh", os.path.join(tmp, "ro"), common.binary("offloadd"),
                                conf, os.path.join(tmp, "d.sock")],
                               capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
            self.assertIn("spill_directory %s is on a file system that is read-only" % spill,
                          r.stderr)
            self.assertIn("ReadWritePaths=%s" % spill, r.stderr)
            ok = check_config(conf, ["--socket_path=" + os.path.join(tmp, "d.sock")])
            self.assertEqual(ok.returncode, 0, ok.stdout + ok.stderr)
        finally:
            shutil.rmtree(tmp)

    def test_no_hardening_that_breaks_cuda(self):
        # These hide /dev/nvidia* or forbid the driver's W+X mappings.
        for key in ("PrivateDevices", "MemoryDenyWriteExecute", "ProtectKernelModules"):
            self.assertNotIn(svc_value(self.svc, key), ("yes", "true", "1", "on"),
                             "%s breaks the CUDA driver" % key)
        self.assertNotEqual(self.svc.get("DevicePolicy"), "closed")
        self.assertNotEqual(self.svc.get("DevicePolicy"), "strict")

    def test_socket_in_runtime_directory_and_same_config_checked(self):
        start = shlex.split(self.svc["ExecStart"])
        pre = shlex.split(self.svc["ExecStartPre"])
        self.assertEqual(start[0], pre[0], "ExecStartPre must check with the same binary")
        config = start[start.index("--config") + 1]
        self.assertEqual(pre[pre.index("--check-config") + 1], config,
                         "ExecStartPre must check the file ExecStart loads")
        sock = [a.split("=", 1)[1] for a in start if a.startswith("--socket_path=")]
        self.assertEqual(len(sock), 1)
        self.assertEqual(os.path.dirname(sock[0]), "/run/" + self.svc["RuntimeDirectory"])

    def test_exec_flags_exist_in_help(self):
        for key in ("ExecStartPre", "ExecStart"):
            for arg in shlex.split(self.svc[key])[1:]:
                name = common.flag_name(arg)
                if name:
                    self.assertIn(name, self.help_flags, "%s passes %s, unknown to offloadd --help"
                                  % (key, arg))

    def test_exec_start_pre_accepts_example_and_rejects_bad_config(self):
        pre = shlex.split(self.svc["ExecStartPre"])
        i = pre.index("--check-config") + 1
        cmd = [common.binary("offloadd")] + pre[1:]
        cmd[i] = EXAMPLE
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        self.assertTrue(config_valid(r), r.stdout + r.stderr)
        tmp = common.short_tmpdir("ofmu")
        try:
            bad = os.path.join(tmp, "bad.conf")
            with open(bad, "w") as f:
                f.write(common.read_text(EXAMPLE) + "\ncopy_threads: 0\n")
            cmd[i] = bad
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
            self.assertEqual(r.returncode, 2, "a bad config must fail ExecStartPre with 2")
        finally:
            shutil.rmtree(tmp)

    @unittest.skipUnless(shutil.which("systemd-analyze"), "systemd-analyze not installed")
    def test_systemd_analyze_verify(self):
        tmp = common.short_tmpdir("ofmu")
        try:
            text = common.read_text(UNIT).replace("/usr/local/bin/offloadd", common.binary("offloadd"))
            path = os.path.join(tmp, "offloadd.service")
            with open(path, "w") as f:
                f.write(text)
            r = subprocess.run(["systemd-analyze", "verify", path], capture_output=True,
                               text=True, timeout=60)
            ours = [l for l in (r.stdout + r.stderr).splitlines() if "offloadd.service" in l]
            self.assertEqual(ours, [], "systemd-analyze verify complains about the unit")
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        finally:
            shutil.rmtree(tmp)


def svc_value(section, key):
    return (section.get(key) or "").strip().lower()


class ExampleConfigTest(unittest.TestCase):
    def test_passes_check_config(self):
        r = check_config(EXAMPLE)
        self.assertTrue(config_valid(r), r.stdout + r.stderr)

    def test_commented_examples_pass_check_config(self):
        tmp = common.short_tmpdir("ofmc")
        try:
            path = os.path.join(tmp, "full.conf")
            text = uncomment_examples(common.read_text(EXAMPLE))
            self.assertRegex(text, r"(?m)^links \{$")
            self.assertRegex(text, r"(?m)^gpu_weights \{$")
            with open(path, "w") as f:
                f.write(text)
            r = check_config(path)
            self.assertTrue(config_valid(r), r.stdout + r.stderr)
        finally:
            shutil.rmtree(tmp)

    def test_every_field_present_and_commented(self):
        lines = common.read_text(EXAMPLE).splitlines()
        for field in proto_fields("DaemonConfig"):
            idx = [i for i, l in enumerate(lines)
                   if re.match(r"^(# )?%s(:| \{)" % field, l)]
            self.assertTrue(idx, "DaemonConfig field %s missing from the example" % field)
            i = idx[0]
            self.assertTrue(i > 0 and lines[i - 1].startswith("#"),
                            "field %s has no comment above it" % field)
        text = "\n".join(lines)
        for message in ("LinkConfig", "GpuWeight"):
            for field in proto_fields(message):
                self.assertRegex(text, r"(?m)^#\s+%s:\s+\S" % field,
                                 "%s.%s not explained in the example" % (message, field))


class KubernetesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.docs = load_k8s_docs()
        ds = [d for d in cls.docs if d.get("kind") == "DaemonSet"]
        cm = [d for d in cls.docs if d.get("kind") == "ConfigMap"]
        assert len(ds) == 1 and len(cm) == 1, "want one DaemonSet and one ConfigMap"
        cls.ds, cls.cm = ds[0], cm[0]
        cls.spec = cls.ds["spec"]["template"]["spec"]
        cls.container = [c for c in cls.spec["containers"] if c["name"] == "offloadd"][0]
        cls.args = cls.container.get("command", [])[1:] + cls.container.get("args", [])
        cls.flags = {}
        for a in cls.args:
            if common.flag_name(a) and "=" in a:
                cls.flags[common.flag_name(a)] = a.split("=", 1)[1]
        cls.help_flags, _ = common.help_flags(common.binary("offloadd"))

    def test_every_document_has_kind_and_name(self):
        for d in self.docs:
            self.assertIn("apiVersion", d)
            self.assertIn("kind", d)
            self.assertTrue(d.get("metadata", {}).get("name"))
        self.assertEqual(self.ds["apiVersion"], "apps/v1")
        self.assertEqual(self.ds["metadata"]["namespace"], self.cm["metadata"]["namespace"])

    def test_selector_matches_template(self):
        sel = self.ds["spec"]["selector"]["matchLabels"]
        labels = self.ds["spec"]["template"]["metadata"]["labels"]
        for k, v in sel.items():
            self.assertEqual(labels.get(k), v)

    def test_container_command_and_flags_exist_in_help(self):
        # offloadd, or the image's entrypoint, which passes its arguments to offloadd.
        self.assertIn(os.path.basename(self.container["command"][0]),
                      ("offloadd", "offloadd-entrypoint"))
        for a in self.args:
            name = common.flag_name(a)
            self.assertIsNotNone(name, "argument %r is not a --flag" % a)
            self.assertIn(name, self.help_flags, "%s is unknown to offloadd --help" % a)
        for needed in ("config", "socket_path", "metrics_address"):
            self.assertIn(needed, self.flags, "container must pass --%s=..." % needed)

    def test_socket_on_host_path(self):
        sock_dir = os.path.dirname(self.flags["socket_path"])
        mounts = {m["mountPath"]: m["name"] for m in self.container["volumeMounts"]}
        self.assertIn(sock_dir, mounts, "socket directory not mounted")
        vol = [v for v in self.spec["volumes"] if v["name"] == mounts[sock_dir]][0]
        self.assertIn("hostPath", vol)
        self.assertEqual(vol["hostPath"].get("type"), "DirectoryOrCreate")

    def test_memlock_gpu_visibility_and_ipc(self):
        caps = self.container["securityContext"]["capabilities"]["add"]
        self.assertIn("IPC_LOCK", caps)
        env = {e["name"]: e.get("value") for e in self.container.get("env", [])}
        self.assertEqual(env.get("NVIDIA_VISIBLE_DEVICES"), "all")
        self.assertIn("compute", env.get("NVIDIA_DRIVER_CAPABILITIES", ""))
        self.assertTrue(self.spec.get("hostIPC"), "CUDA IPC events and shm need the host IPC ns")
        self.assertTrue(self.spec.get("hostPID"), "CUDA IPC handles need the host PID ns")
        limits = self.container.get("resources", {}).get("limits", {})
        self.assertNotIn("nvidia.com/gpu", limits, "the daemon must not take GPUs from pods")

    def test_memory_request_covers_pool(self):
        pool = int(re.search(r"(?m)^\s*pool_bytes:\s*(\d+)", self.conf_text()).group(1))
        res = self.container["resources"]
        req = parse_quantity(res["requests"]["memory"])
        self.assertGreaterEqual(req, pool, "memory request below pool_bytes")
        self.assertGreaterEqual(parse_quantity(res["limits"]["memory"]), req)

    def test_probes_run_offloadctl_health_on_the_socket(self):
        self.assertIn("readinessProbe", self.container)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if probe not in self.container:
                continue
            cmd = self.container[probe]["exec"]["command"]
            self.assertEqual(os.path.basename(cmd[0]), "offloadctl")
            self.assertEqual(cmd[cmd.index("--socket") + 1], self.flags["socket_path"])
            self.assertEqual(cmd[-1], "health")
            # offloadctl waits up to 5 s for the socket: a shorter timeout reports no reason.
            self.assertGreaterEqual(self.container[probe].get("timeoutSeconds", 1), 6)

    def test_metrics_port_and_scrape_annotations(self):
        port = int(self.flags["metrics_address"].rsplit(":", 1)[1])
        host = self.flags["metrics_address"].rsplit(":", 1)[0]
        self.assertNotIn(host, ("127.0.0.1", "localhost", ""), "Prometheus cannot reach loopback")
        ports = {p["name"]: p["containerPort"] for p in self.container["ports"]}
        self.assertEqual(ports.get("metrics"), port)
        ann = self.ds["spec"]["template"]["metadata"]["annotations"]
        self.assertEqual(ann.get("prometheus.io/scrape"), "true")
        self.assertEqual(ann.get("prometheus.io/port"), str(port))
        self.assertEqual(ann.get("prometheus.io/path"), "/metrics")

    def test_configmap_mounted_where_config_flag_points(self):
        conf = self.flags["config"]
        mounts = {m["mountPath"]: m["name"] for m in self.container["volumeMounts"]}
        self.assertIn(os.path.dirname(conf), mounts)
        vol = [v for v in self.spec["volumes"] if v["name"] == mounts[os.path.dirname(conf)]][0]
        self.assertEqual(vol["configMap"]["name"], self.cm["metadata"]["name"])
        self.assertIn(os.path.basename(conf), self.cm["data"])

    def conf_text(self):
        return self.cm["data"][os.path.basename(self.flags["config"])]

    def test_configmap_with_container_flags_passes_check_config(self):
        tmp = common.short_tmpdir("ofmk")
        try:
            path = os.path.join(tmp, "offloadd.conf")
            with open(path, "w") as f:
                f.write(self.conf_text())
            flags = [a for a in self.args if common.flag_name(a) != "config"]
            r = check_config(path, flags)
            self.assertTrue(config_valid(r), r.stdout + r.stderr)
        finally:
            shutil.rmtree(tmp)

    def test_check_config_notes_huge_pages_dev_shm_cannot_give(self):
        with open("/proc/self/mountinfo") as f:
            shm = [l.split(" - ", 1)[1] for l in f if l.split()[4] == "/dev/shm"]
        if not shm or "huge=" in shm[-1].split()[2]:
            self.skipTest("/dev/shm here is mounted with huge=...: nothing to note")
        tmp = common.short_tmpdir("ofmh")
        try:
            path = os.path.join(tmp, "offloadd.conf")
            with open(path, "w") as f:
                f.write(self.conf_text())
            flags = [a for a in self.args if common.flag_name(a) != "config"]
            r = check_config(path, flags + ["--socket_path=" + os.path.join(tmp, "d.sock")])
            self.assertTrue(config_valid(r), r.stdout + r.stderr)
            self.assertIn("offloadd: note: pool_huge_pages is set, but the shared pool "
                          "(pool_shm_name) lives in /dev/shm, a tmpfs mounted with huge=never",
                          r.stdout)
        finally:
            shutil.rmtree(tmp)

    def test_readiness_probe_against_live_daemon(self):
        cmd = list(self.container["readinessProbe"]["exec"]["command"])
        tmp = common.short_tmpdir("ofmk")
        daemon = None
        try:
            daemon = common.Daemon(tmp, extra=["--pool_bytes=8MiB"])
            daemon.wait_ready()
            cmd[0] = common.binary("offloadctl")
            cmd[cmd.index("--socket") + 1] = daemon.socket_path
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("SERVING", r.stdout)
            daemon.stop()
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            self.assertNotEqual(r.returncode, 0, "probe must fail when the daemon is gone")
        finally:
            if daemon:
                daemon.stop()
            shutil.rmtree(tmp)


def parse_quantity(q):
    """Kubernetes memory quantity -> bytes."""
    m = re.match(r"^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$", str(q))
    assert m, "bad quantity %r" % q
    mult = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6,
            "G": 1e9, "T": 1e12}[m.group(2)]
    return float(m.group(1)) * mult


class VersionAndTargetsTest(unittest.TestCase):
    """What the deployment files name exists: image tags are the build's version, and every
    `make TARGET` the docs and deploy files mention is a Makefile target."""

    def test_image_tags_are_the_daemon_version(self):
        v = subprocess.run([common.binary("offloadd"), "--version"], capture_output=True,
                           text=True, timeout=20).stdout.split()[1]
        ds = [d for d in load_k8s_docs() if d.get("kind") == "DaemonSet"][0]
        spec = ds["spec"]["template"]["spec"]
        images = [c["image"] for c in spec["containers"] + spec.get("initContainers", [])]
        self.assertTrue(images)
        for image in images:
            self.assertEqual(image.rsplit(":", 1)[1], v, "%s is not version %s" % (image, v))
        for path in (README, os.path.join(common.REPO, "README.md")):
            for tag in re.findall(r"offloadd:(\d+\.\d+\.\d+)", common.read_text(path)):
                self.assertEqual(tag, v, "%s names offloadd:%s"
                                 % (os.path.relpath(path, common.REPO), tag))
        build = common.read_text(os.path.join(common.DEPLOY, "container", "build-image.sh"))
        code = "\n".join(l for l in build.splitlines() if not l.lstrip().startswith("#"))
        self.assertNotRegex(code, r"\d+\.\d+\.\d+", "build-image.sh hard-codes a version")
        pyproject = common.read_text(os.path.join(common.REPO, "client", "python",
                                                  "pyproject.toml"))
        self.assertRegex(pyproject, r'(?m)^version = "%s"' % re.escape(v))

    def test_every_make_target_mentioned_exists(self):
        makefile = common.read_text(os.path.join(common.REPO, "Makefile"))
        targets = set(re.findall(r"(?m)^([a-z][a-z-]*):", makefile))
        docs = os.path.join(common.REPO, "docs")
        files = [os.path.join(common.REPO, "README.md"), README] + [
            os.path.join(docs, n) for n in sorted(os.listdir(docs)) if n.endswith(".md")] + [
                 os.path.join(common.DEPLOY, "container", "Containerfile")]
        files += [os.path.join(common.DEPLOY, n) for n in os.listdir(common.DEPLOY)
                  if n.endswith(".sh")]
        files += [os.path.join(common.DEPLOY, "container", n)
                  for n in os.listdir(os.path.join(common.DEPLOY, "container")) if n.endswith(".sh")]
        for path in files:
            for target in re.findall(r"`(?:sudo )?make ([a-z][a-z-]*)", common.read_text(path)):
                self.assertIn(target, targets, "%s names `make %s`, which the Makefile lacks"
                              % (os.path.relpath(path, common.REPO), target))


class ReadmeTest(unittest.TestCase):
    """deploy/README.md's training-pod example mounts what the DaemonSet shares."""

    def test_pod_example_mounts_the_socket_directory(self):
        text = common.read_text(README)
        blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
        pods = [d for b in blocks for d in yaml.safe_load_all(b) if d and d.get("kind") == "Pod"]
        self.assertEqual(len(pods), 1, "README needs one Pod example in a ```yaml block")
        pod = pods[0]["spec"]
        ds = [d for d in load_k8s_docs() if d.get("kind") == "DaemonSet"][0]
        ds_vols = ds["spec"]["template"]["spec"]["volumes"]
        host_dir = [v["hostPath"]["path"] for v in ds_vols if "hostPath" in v][0]
        vols = {v["name"]: v for v in pod["volumes"]}
        mounted = False
        for c in pod["containers"]:
            for m in c.get("volumeMounts", []):
                v = vols[m["name"]]
                if v.get("hostPath", {}).get("path") == host_dir:
                    mounted = True
                    self.assertEqual(m["mountPath"], host_dir)
        self.assertTrue(mounted, "the pod example does not mount %s" % host_dir)
        self.assertTrue(pod.get("hostIPC") and pod.get("hostPID"))
        for word in ("LimitMEMLOCK", "systemctl", "--check-config"):
            self.assertIn(word, text)


if __name__ == "__main__":
    unittest.main()
