"""The projector's OpenBLAS kernels are visible: GetStats ``projector_blas``, ``offloadctl stats``,
the ``offloadd_projector_blas_info`` metric, and ``--check-config`` notes; an OPENBLAS_CORETYPE
in the daemon's environment is the operator's pin and is respected.

The pins here are set in the daemon's own environment only (``env VAR=...`` before it); the test
process's variables are left as they are. When the test process itself runs with
OPENBLAS_CORETYPE set, the daemons it starts inherit it and report source "operator".

Run: tests/python/run.sh -k projector_blas.
"""

import os
import subprocess
import tempfile
import unittest
import urllib.request

from daemon_fixture import Daemon, daemon_bin, free_port
from test_cli_backends import offloadctl_bin

CORES = {"Prescott", "Opteron_SSE3", "Opteron", "Barcelona", "Bobcat", "Core2", "Penryn",
         "Dunnington", "Atom", "Nehalem", "Sandybridge", "Bulldozer", "Piledriver",
         "Steamroller", "Excavator", "Haswell", "Zen", "SkylakeX", "Cooperlake",
         "SapphireRapids"}



class ProjectorBlasTest(unittest.TestCase):
    def test_stats_ctl_and_metric_name_the_core(self):
        port = free_port()
        d = Daemon("16MiB", ("--metrics_address", "127.0.0.1:%d" % port))
        try:
            b = d.stats().projector_blas
            pinned = os.environ.get("OPENBLAS_CORETYPE")
            if pinned:
                self.assertEqual((b.source, b.core.lower()), ("operator", pinned.lower()))
            else:
                self.assertIn(b.source, ("auto", "selected"))
                self.assertIn(b.core, CORES)
                if b.source == "auto":
                    self.assertEqual(b.core, b.openblas_core)
            self.assertIn(b.isa, ("sse3", "ssse3", "sse4.2", "avx", "avx2", "avx512"))
            self.assertGreater(b.self_check_gflops, 0)
            self.assertGreater(b.self_check_expected_gflops, 0)
            metrics = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port,
                                             timeout=10).read().decode()
            line = [l for l in metrics.splitlines()
                    if l.startswith("offloadd_projector_blas_info{")]
            self.assertEqual(len(line), 1, metrics)
            for label in ('core="%s"' % b.core, 'isa="%s"' % b.isa,
                          'openblas_core="%s"' % b.openblas_core, 'source="%s"' % b.source):
                self.assertIn(label, line[0])
            self.assertTrue(line[0].endswith(" 1"), line[0])
            ctl = offloadctl_bin()
            if ctl is not None:
                out = subprocess.run([ctl, "--socket", d.sock, "stats"], capture_output=True,
                                     text=True, timeout=30)
                self.assertEqual(out.returncode, 0, out.stderr)
                self.assertIn("projector BLAS: OpenBLAS core %s (%s; OpenBLAS alone picks %s"
                              % (b.core, b.source, b.openblas_core), out.stdout)
        finally:
            d.stop()

    def test_an_operator_pin_is_respected_and_noted(self):
        d = Daemon("16MiB", prefix=("env", "OPENBLAS_CORETYPE=Prescott"))
        try:
            b = d.stats().projector_blas
        finally:
            d.stop()
        self.assertEqual((b.core, b.source), ("Prescott", "operator"))
        self.assertIn(b.openblas_core, CORES)  # OpenBLAS's own pick, asked without the pin
        if b.isa != "sse3":  # a CPU that runs more than Prescott's SSE3
            self.assertEqual(len(b.notes), 1, b.notes)
            self.assertIn("OPENBLAS_CORETYPE=Prescott is set (respected)", b.notes[0])
            self.assertIn("slower", b.notes[0])
        with tempfile.NamedTemporaryFile("w", suffix=".conf") as conf:
            conf.write("projector { workers: 1 }\n")
            conf.flush()
            sock = "/tmp/ofd-py-check-%d.sock" % os.getpid()
            out = subprocess.run(["env", "OPENBLAS_CORETYPE=Prescott", daemon_bin(),
                                  "--check-config", conf.name, "--socket_path", sock,
                                  "--metrics_address="],
                                 capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        if b.isa != "sse3":
            self.assertIn("offloadd: note: projector BLAS: OPENBLAS_CORETYPE=Prescott",
                          out.stdout)

    def test_no_projector_no_blas(self):
        with tempfile.NamedTemporaryFile("w", suffix=".conf") as conf:
            conf.write("projector { enabled: false }\n")
            conf.flush()
            d = Daemon("16MiB", ("--config", conf.name))
            try:
                self.assertFalse(d.stats().HasField("projector_blas"))
            finally:
                d.stop()


if __name__ == "__main__":
    unittest.main()
