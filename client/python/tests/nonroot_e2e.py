"""The non-root end-to-end run of test_non_root.py, in a private mount namespace.

  unshare --mount --propagation private PYTHON nonroot_e2e.py WORKDIR OFFLOADD OFFLOADCTL

As the DaemonSet runs it, but on this host: a fresh tmpfs on /run (so /run/offloadd, the
system-wide daemon's directory, exists only in this namespace), the image's entrypoint prepares
/run/offloadd for uid 10001 and the socket group 2000, and the daemon runs as uid 10001 (groups
10001, 2000) with the ConfigMap's config and the container's flags. Changed for this host, and
only these: backend "shm" (no GPU), pool_bytes 128 MiB, pool_mlock false (no CAP_IPC_LOCK),
a pool_shm_name of its own, no metrics port. Then, with no socket path configured anywhere:
  * uid 10002 in group 2000 trains with the Transformers hooks and refreshes a GaLore projector
    (nonroot_worker.py member);
  * uid 10003 in no group tries the same (nonroot_worker.py outsider) and runs
    `offloadctl health`.
Prints one JSON object (every result and the daemon's log) on stdout's last line.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
DAEMON_UID, MEMBER_UID, OUTSIDER_UID, SOCKET_GID = 10001, 10002, 10003, 2000
SOCKET = "/run/offloadd/offloadd.sock"


def shipped_config(pool_name):
    """The ConfigMap's offloadd.conf with this host's changes (module doc)."""
    import yaml
    with open(os.path.join(REPO, "deploy", "k8s", "configmap.yaml")) as f:
        cm = [d for d in yaml.safe_load_all(f) if d and d.get("kind") == "ConfigMap"][0]
    text = cm["data"]["offloadd.conf"]
    for key, value in (("backend", '"shm"'), ("pool_bytes", "134217728"),
                       ("pool_mlock", "false"), ("pool_shm_name", '"%s"' % pool_name),
                       ("metrics_address", '""')):
        text, n = re.subn(r"(?m)^(\s*)%s:.*$" % key, r"\g<1>%s: %s" % (key, value), text)
        assert n == 1, "the ConfigMap has no single %s line" % key
    return text


def as_user(uid, groups):
    return ["setpriv", "--reuid=%d" % uid, "--regid=%d" % uid] + (
        ["--groups=" + ",".join(map(str, groups))] if groups else ["--clear-groups"])


def worker(work, uid, groups, role):
    home = os.path.join(work, "home-%d" % uid)
    os.makedirs(home)
    os.chown(home, uid, uid)
    env = {"PATH": "/usr/bin:/bin", "HOME": home, "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    t0 = time.monotonic()
    r = subprocess.run(as_user(uid, groups) + [sys.executable, os.path.join(HERE,
                                                                            "nonroot_worker.py"),
                                               role],
                       capture_output=True, text=True, timeout=600, env=env)
    out = {"rc": r.returncode, "stderr": r.stderr[-4000:], "wall_seconds": time.monotonic() - t0}
    lines = r.stdout.strip().splitlines()
    if r.returncode == 0 and lines:
        out.update(json.loads(lines[-1]))
    return out


def main(work, offloadd, offloadctl):
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", "/run"], check=True)
    entry = os.path.join(REPO, "deploy", "container", "entrypoint.sh")
    subprocess.run(["sh", entry, "prepare-socket-dir", "/run/offloadd", str(DAEMON_UID),
                    str(SOCKET_GID)], check=True, capture_output=True)
    pool_name = "offloadd-nonroot-%d" % os.getpid()
    conf = os.path.join(work, "offloadd.conf")
    with open(conf, "w") as f:
        f.write(shipped_config(pool_name))
    log_path = os.path.join(work, "daemon.log")
    result = {}
    with open(log_path, "w") as log:
        daemon = subprocess.Popen(as_user(DAEMON_UID, [DAEMON_UID, SOCKET_GID]) + [
            offloadd, "--config", conf, "--socket_path=" + SOCKET, "--metrics_address="],
            stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(400):
            if os.path.exists(SOCKET) or daemon.poll() is not None:
                break
            time.sleep(0.05)
        st = os.stat(SOCKET)
        result["socket"] = {"uid": st.st_uid, "gid": st.st_gid, "mode": st.st_mode & 0o777}
        result["member"] = worker(work, MEMBER_UID, [SOCKET_GID], "member")
        result["outsider"] = worker(work, OUTSIDER_UID, [], "outsider")
        t0 = time.monotonic()
        h = subprocess.run(as_user(OUTSIDER_UID, []) + [offloadctl, "health"],
                           capture_output=True, text=True, timeout=60)
        result["outsider_health"] = {"rc": h.returncode, "stdout": h.stdout, "stderr": h.stderr,
                                     "seconds": time.monotonic() - t0}
        h = subprocess.run(as_user(MEMBER_UID, [SOCKET_GID]) + [offloadctl, "health"],
                           capture_output=True, text=True, timeout=60)
        result["member_health"] = {"rc": h.returncode, "stdout": h.stdout, "stderr": h.stderr}
    finally:
        daemon.terminate()
        result["daemon_rc"] = daemon.wait(30)
        try:
            os.unlink("/dev/shm/" + pool_name)
        except OSError:
            pass
    with open(log_path) as f:
        result["daemon_log"] = f.read()[-6000:]
    print(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:4])
