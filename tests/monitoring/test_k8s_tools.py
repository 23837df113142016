"""The Kubernetes manifests checked by real tools, pinned in deploy/tools.lock (deploy/tools-env.sh
installs them once per machine; tests/monitoring/run.sh passes their bin directory as
$OFFLOADD_TOOLS_BIN).

* kubernetes-validate --strict against Kubernetes KUBERNETES_VERSION: every document of
  deploy/k8s and the README's training-pod example is a valid object of its kind (unknown
  fields rejected).
* checkov (framework kubernetes): no failed check; every check the DaemonSet skips is named in
  its checkov.io/skip annotations and justified in deploy/README.md "Security trade-offs"; the
  same DaemonSet without the annotations fails exactly those checks (the scan is real).
Run: OFFLOADD_TOOLS_BIN=$(bash deploy/tools-env.sh) /usr/bin/python3 -m unittest test_k8s_tools
"""
import json
import os
import re
import shutil
import subprocess
import unittest

import yaml

import common

KUBERNETES_VERSION = "1.37.0"
K8S = os.path.join(common.DEPLOY, "k8s")
README = os.path.join(common.DEPLOY, "README.md")
TOOLS = os.environ.get("OFFLOADD_TOOLS_BIN", "")


def tool(name):
    return os.path.join(TOOLS, name)


def readme_pod():
    text = common.read_text(README)
    for block in re.findall(r"```yaml\n(.*?)```", text, re.S):
        for doc in yaml.safe_load_all(block):
            if doc and doc.get("kind") == "Pod":
                return block
    raise AssertionError("deploy/README.md has no Pod example")


def daemonset():
    with open(os.path.join(K8S, "daemonset.yaml")) as f:
        return [d for d in yaml.safe_load_all(f) if d and d.get("kind") == "DaemonSet"][0]


def skip_annotations(ds):
    """{check id: reason} from the DaemonSet's checkov.io/skipN annotations."""
    out = {}
    for key, value in ds["metadata"].get("annotations", {}).items():
        if key.startswith("checkov.io/skip"):
            check, _, reason = value.partition("=")
            out[check.strip()] = reason.strip()
    return out


def checkov(directory):
    r = subprocess.run([tool("checkov"), "-d", directory, "--framework", "kubernetes",
                        "--skip-download", "-o", "json"],
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, BC_SKIP_MAPPING="TRUE", LOG_LEVEL="ERROR"))
    doc = json.loads(r.stdout)
    doc = doc[0] if isinstance(doc, list) else doc
    return doc["results"], doc["summary"]


@unittest.skipUnless(TOOLS and os.access(tool("checkov"), os.X_OK),
                     "set OFFLOADD_TOOLS_BIN=$(bash deploy/tools-env.sh) (tests/monitoring/run.sh "
                     "does)")
class KubernetesToolsTest(unittest.TestCase):
    def test_schema_valid_for_a_current_kubernetes(self):
        tmp = common.short_tmpdir("ofkv")
        try:
            pod = os.path.join(tmp, "training-pod.yaml")
            with open(pod, "w") as f:
                f.write(readme_pod())
            files = [os.path.join(K8S, n) for n in sorted(os.listdir(K8S)) if n.endswith(".yaml")]
            r = subprocess.run([tool("kubernetes-validate"), "--strict", "-k", KUBERNETES_VERSION]
                               + files + [pod], capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            passed = re.findall(r"passed for resource (\S+) against version", r.stdout + r.stderr)
            self.assertEqual(sorted(passed), sorted([
                "configmap/offloadd-config", "daemonset/offloadd", "namespace/offloadd",
                "priorityclass/offloadd-node-critical", "pod/train-0"]), r.stdout + r.stderr)
        finally:
            shutil.rmtree(tmp)

    def test_checkov_passes_with_each_accepted_finding_justified(self):
        results, summary = checkov(K8S)
        failed = [(c["check_id"], c["resource"]) for c in results["failed_checks"]]
        self.assertEqual(failed, [], "checkov findings neither fixed nor justified")
        self.assertGreater(summary["passed"], 50)
        skipped = {c["check_id"] for c in results["skipped_checks"]}
        annotated = skip_annotations(daemonset())
        self.assertEqual(skipped, set(annotated))
        section = common.read_text(README).split("### Security trade-offs", 1)
        self.assertEqual(len(section), 2, "deploy/README.md has no 'Security trade-offs'")
        text = section[1].split("\n## ", 1)[0]
        for check in sorted(annotated):
            line = [l for l in text.splitlines() if check in l]
            self.assertTrue(line, "%s is skipped but not justified in deploy/README.md" % check)
            self.assertGreater(len(line[0]), 80, "%s: a justification, not a mention" % check)
        self.assertIn("pod-security.kubernetes.io/enforce: privileged", text)

    def test_without_the_annotations_exactly_those_checks_fail(self):
        tmp = common.short_tmpdir("ofck")
        try:
            ds = daemonset()
            annotated = skip_annotations(ds)
            ds["metadata"]["annotations"] = {k: v for k, v in ds["metadata"]["annotations"].items()
                                             if not k.startswith("checkov.io/skip")}
            with open(os.path.join(tmp, "daemonset.yaml"), "w") as f:
                yaml.safe_dump(ds, f)
            results, _ = checkov(tmp)
            self.assertEqual({c["check_id"] for c in results["failed_checks"]}, set(annotated))
        finally:
            shutil.rmtree(tmp)


if __name__ == "__main__":
    unittest.main()
