"""Shared helpers of the tests/monitoring suites (run with /usr/bin/python3).

Binaries come from $OFFLOADD_BIN_DIR (default build/bin, after `make build`). Nothing here
touches the network beyond 127.0.0.1; every process started is stopped by its owner.
"""
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY = os.path.join(REPO, "deploy")
MONITORING = os.path.join(REPO, "monitoring")
DASHBOARD = os.path.join(MONITORING, "grafana", "offloadd-dashboard.json")
PROMETHEUS_YML = os.path.join(MONITORING, "prometheus", "prometheus.yml")
PROMETHEUS_K8S_YML = os.path.join(MONITORING, "prometheus", "prometheus-kubernetes.yml")
ALERTS_YML = os.path.join(MONITORING, "prometheus", "alerts.yml")
ALERTS_TEST_YML = os.path.join(MONITORING, "prometheus", "alerts_test.yml")

# The metric families the daemon must export: (name, type, labels at least one series must carry).
# Histograms are checked through their _bucket/_sum/_count series. Families marked
# "requested" did not exist in server/metrics/metrics.h when this suite was written.
ISSUE_METRICS = [
    ("offloadd_build_info", "gauge", ("version", "backend")),
    ("offloadd_pool_capacity_bytes", "gauge", ("numa_node",)),
    ("offloadd_pool_used_bytes", "gauge", ("numa_node",)),
    ("offloadd_pool_peak_used_bytes", "gauge", ("numa_node",)),
    ("offloadd_pool_pinned_bytes", "gauge", ("numa_node",)),  # requested
    ("offloadd_transfer_bytes_total", "counter", ("gpu", "direction", "status")),
    ("offloadd_transfers_total", "counter", ("gpu", "direction", "status")),
    ("offloadd_transfer_duration_seconds", "histogram", ("direction",)),
    ("offloadd_transfer_size_bytes", "histogram", ("direction",)),
    ("offloadd_link_capacity_bytes_per_second", "gauge", ("link", "direction")),
    ("offloadd_link_busy_seconds_total", "counter", ("link", "direction")),
    ("offloadd_link_queue_wait_seconds", "histogram", ("link", "direction", "class")),  # requested
    ("offloadd_sessions_open", "gauge", ()),
    ("offloadd_sessions_ended_total", "counter", ("cause",)),
    ("offloadd_offloads_waiting", "gauge", ()),
    ("offloadd_offloads_refused_total", "counter", ()),
    ("offloadd_reload_deadline_misses_total", "counter", ("gpu", "link")),  # requested
    ("offloadd_ipc_handles_open", "gauge", ("gpu",)),  # requested
    ("offloadd_ipc_handle_opens_total", "counter", ("gpu",)),  # requested
    ("offloadd_projector_refresh_duration_seconds", "histogram", ()),  # requested
    ("offloadd_projector_queue_depth", "gauge", ()),  # requested
]

# Labels no offloadd series may carry (docs/ARCHITECTURE.md: never a pid or client label).
FORBIDDEN_LABELS = {"pid", "client", "client_id", "client_name", "session", "session_id", "uid"}

# Series names Prometheus itself makes; allowed in rules and dashboards.
PROMETHEUS_OWN_METRICS = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}


def bin_dir():
    return os.path.abspath(os.environ.get("OFFLOADD_BIN_DIR", os.path.join(REPO, "build", "bin")))


def binary(name):
    return os.path.join(bin_dir(), name)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def short_tmpdir(prefix):
    """A temp dir under /tmp: Unix socket paths must stay under 107 bytes."""
    return tempfile.mkdtemp(prefix=prefix, dir="/tmp")


def help_flags(path):
    """Flag names (dashes as underscores) that `path --help` mentions."""
    out = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=10)
    text = out.stdout + out.stderr
    return {m.replace("-", "_") for m in re.findall(r"--([a-zA-Z][a-zA-Z0-9_-]*)", text)}, text


def flag_name(arg):
    """'--pool-bytes=1' -> 'pool_bytes'; None when arg is not a flag."""
    if not arg.startswith("--"):
        return None
    return arg[2:].split("=", 1)[0].replace("-", "_")


# --- PromQL ------------------------------------------------------------------------------------
_PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
                    "or", "unless", "offset", "inf", "nan", "atan2"}


def promql_metric_names(expr):
    """Metric names a PromQL expression selects (approximate parser, enough for our queries).

    Strings, label matchers, range/subquery brackets and grouping clauses are removed; what is
    left that is an identifier not followed by '(' and not a keyword is a metric name.
    """
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    s = re.sub(r"'(?:[^'\\]|\\.)*'", "''", s)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", s):
        before = s[m.start() - 1] if m.start() else " "
        if before.isdigit() or before in ".$":
            continue  # 1e9, 5m, $variable
        if s[m.end():].lstrip().startswith("("):
            continue  # function or aggregation
        if m.group(0).lower() in _PROMQL_KEYWORDS:
            continue
        names.add(m.group(0))
    return names


def grafana_to_promql(expr):
    """Replaces Grafana's template variables with values Prometheus accepts."""
    for var, value in (("$__rate_interval", "1m"), ("$__interval", "1m"), ("$__range", "1h"),
                       ("${datasource}", ""), ("$instance", ".*"), ("$gpu", ".*")):
        expr = expr.replace(var, value)
    return expr


def label_values_selector(query):
    """'label_values(sel, label)' -> 'sel'; 'label_values(label)' -> None."""
    m = re.match(r"\s*label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$", query, re.S)
    return m.group(1).strip() if m else None


def dashboard_queries(dashboard):
    """[(where, promql)] for every panel target and query variable of a Grafana dashboard."""
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                if t.get("expr"):
                    out.append(("panel '%s'" % p.get("title"), t["expr"]))
            walk(p.get("panels", []))

    walk(dashboard.get("panels", []))
    for v in dashboard.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        sel = label_values_selector(q or "")
        if sel:
            out.append(("variable '%s'" % v["name"], sel))
    return out


def rules_queries(rules_doc):
    """[(where, promql)] for every rule of a Prometheus rules file."""
    out = []
    for g in rules_doc.get("groups", []):
        for r in g.get("rules", []):
            out.append(("rule '%s'" % (r.get("alert") or r.get("record")), r["expr"]))
    return out


def read_text(path):
    with open(path) as f:
        return f.read()


def load_dashboard():
    with open(DASHBOARD) as f:
        return json.load(f)


def load_yaml(path):
    import yaml
    with open(path) as f:
        return yaml.safe_load(f)


# --- Prometheus text exposition ----------------------------------------------------------------
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_exposition(text):
    """-> (samples [(name, {label: value}, float)], types {family: type})."""
    samples, types = [], {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            parts = line.split()
            if len(parts) >= 4:
                types[parts[2]] = parts[3]
            continue
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m:
            labels = dict(_LABEL.findall(m.group(2) or ""))
            try:
                value = float(m.group(3))
            except ValueError:
                value = float("nan")
            samples.append((m.group(1), labels, value))
    return samples, types


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


# --- Processes ---------------------------------------------------------------------------------
class Daemon:
    """build/bin/offloadd on a socket under `tmpdir`, the shm backend, a small pool."""

    def __init__(self, tmpdir, metrics_port=None, extra=(), env=None):
        self.socket_path = os.path.join(tmpdir, "d.sock")
        self.log_path = os.path.join(tmpdir, "offloadd.log")
        self.metrics_port = metrics_port
        args = [binary("offloadd"), "--socket_path=" + self.socket_path, "--backend=shm",
                "--pool_bytes=64MiB",
                "--metrics_address=" + ("127.0.0.1:%d" % metrics_port if metrics_port else "")]
        args += list(extra)
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, timeout=20):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "offloadd: ready on" in self.log():
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError("offloadd did not become ready (exit %s); log:\n%s"
                             % (self.proc.poll(), self.log()[-3000:]))

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def stop(self):
        stop_process(self.proc)
        self._log.close()


def stop_process(proc, timeout=10):
    """SIGTERM, then SIGKILL after `timeout` s; only the given process."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def prometheus_query(base_url, query, timeout=5):
    """Instant query -> (status, data or error). HTTP 4xx answers carry the error in JSON."""
    url = base_url + "/api/v1/query?" + urllib.parse.urlencode({"query": query})
    try:
        body = http_get(url, timeout)
    except urllib.error.HTTPError as e:
        body = e.read().decode()
    doc = json.loads(body)
    if doc.get("status") != "success":
        return "error", doc.get("error", body)
    return "success", doc["data"]
