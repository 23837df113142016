"""The GPU check scripts (tests/gpu) on this machine, without a GPU, so they cannot rot between
GPU runs: run.sh's budgets fit its deadline; its no-GPU and SKIPPED-with-a-GPU paths on a bundle
of stand-in binaries (a daemon deaf to SIGTERM among them); the deadline skipping a step;
GPU_CHECK_ONLY choosing steps (and what they need) and the RERUN line naming the steps to rerun;
the GPU path with and without CUDA IPC on stand-ins and a real shm daemon; torch_check.py against an shm
daemon on CPU; step_timing.py's CPU stand-in against an shm daemon; cuda_probes.py skipping
cleanly without CUDA."""

import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import unittest

from daemon_fixture import PY_ROOT, REPO, DaemonTestCase, daemon_bin

GPU = os.path.join(REPO, "tests", "gpu")
RUN_SH = os.path.join(GPU, "run.sh")


def budgets():
    text = open(RUN_SH).read()
    block = re.search(r'BUDGETS="([^"]*)"', text).group(1)
    return [(n, int(s)) for n, s in (item.split(":") for item in block.split())]


RESERVE_S = 30  # run.sh's reserve over the chosen budgets when GPU_CHECK_ONLY chooses steps


def write_exe(path, body):
    with open(path, "w") as f:
        f.write("#!/bin/bash\n" + body + "\n")
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


def write_deaf_daemon(path):
    """A stand-in offloadd that says it is ready and ignores SIGTERM."""
    write_exe(path, 'trap "" TERM; for a in "$@"; do case $a in --socket_path=*) '
                    's=${a#--socket_path=};; esac; done\n'
                    'echo "offloadd: ready on $s"; while true; do sleep 0.1; done')



def copy_source_package(dest):
    """The package's source as make_gpu_bundle.sh ships it when no wheel could be built: with
    the extension module of the hooks' records beside it (what the wheel carries)."""
    shutil.copytree(os.path.join(PY_ROOT, "offloadd"), dest)
    built = [os.path.join(REPO, p, "store_front.so") for p in (
        os.path.join("build", "bin"), os.path.join("bazel-out", "k8-opt", "bin", "client", "core"))]
    shutil.copy(next((b for b in built if os.path.exists(b)), built[0]),
                os.path.join(dest, "_store_front.abi3.so"))

class RunShTest(unittest.TestCase):
    def test_budgets_add_up_to_less_than_the_default_deadline(self):
        b = budgets()
        total = sum(s for _, s in b)
        deadline = int(re.search(r"GPU_CHECK_DEADLINE_S:-\$\(scaled (\d+)\)",
                                 open(RUN_SH).read()).group(1))
        self.assertEqual(deadline, 546)
        # A reserve for the shell between steps and timeout's 2 s kill grace of overruns.
        self.assertLessEqual(total, deadline - 40, b)
        self.assertEqual(len({n for n, _ in b}), len(b), "step names repeat")
        # Every step run_step is called with has a budget.
        text = open(RUN_SH).read()
        called = set(re.findall(r'run_step (\w+) ', text)) | set(re.findall(r'torch_step (\w+) ',
                                                                              text))
        called -= {"NAME", "\"$name\"", "\"$1\""}
        missing = called - {n for n, _ in b}
        self.assertFalse(missing, missing)

    def fake_bundle(self, kernels_output, gpu_listed, deaf_daemon=False, export_fails=False,
                    no_ipc=False):
        """A bundle dir with run.sh and stand-ins for its binaries; a PATH whose nvidia-smi
        lists a GPU (or none). ``export_fails``: the client export unit test fails. ``no_ipc``:
        the IPC probe finds IPC unsupported and the daemon (a stand-in) stops on SIGTERM."""
        d = tempfile.mkdtemp(prefix="ofd-gpu-bundle-")
        self.addCleanup(shutil.rmtree, d, True)
        os.makedirs(os.path.join(d, "bin"))
        os.makedirs(os.path.join(d, "lib"))
        shutil.copy(RUN_SH, d)
        copy_source_package(os.path.join(d, "python", "offloadd"))
        with open(os.path.join(d, "MANIFEST"), "w") as f:
            f.write("offloadd gpu bundle test\n")
        for name in ("cuda_engine_test", "cuda_export_test"):
            write_exe(os.path.join(d, "bin", name), 'echo "[  PASSED  ] 1 test."')
        if export_fails:
            write_exe(os.path.join(d, "bin", "cuda_export_test"),
                      'echo "[  FAILED  ] 1 test, listed below:"; exit 1')
        write_exe(os.path.join(d, "bin", "kernels_gpu_check"), "echo '%s'" % kernels_output)
        if deaf_daemon:
            write_deaf_daemon(os.path.join(d, "bin", "offloadd"))
        if no_ipc:
            write_exe(os.path.join(d, "bin", "gpu_probes"),
                      'echo "IPC unsupported in this sandbox: cudaIpcOpenMemHandle: x (801)"; '
                      'exit 3')
            write_exe(os.path.join(d, "bin", "offloadd"),
                      'trap "exit 0" TERM; for a in "$@"; do case $a in --socket_path=*) '
                      's=${a#--socket_path=};; esac; done\n'
                      'echo "offloadd: ready on $s"; while true; do sleep 0.1; done')
        tools = os.path.join(d, "tools")
        os.makedirs(tools)
        if gpu_listed:
            write_exe(os.path.join(tools, "nvidia-smi"),
                      'case "$*" in -L*) echo "GPU 0: NVIDIA H200 (UUID: GPU-0)";; '
                      '--list-gpus*) echo "GPU 0: NVIDIA H200";; *) echo "NVIDIA H200";; esac')
        # Budgets x3: the env step imports torch, slow on a loaded build machine.
        env = dict(os.environ, PATH=tools + ":" + os.environ["PATH"], PYTHON=sys.executable,
                   OUT=os.path.join(d, "out"), GPU_CHECK_BUDGET_SCALE="300")
        return d, env

    def run_sh(self, d, env):
        return subprocess.run(["bash", os.path.join(d, "run.sh")], env=env,
                              capture_output=True, text=True, timeout=120)


    def assertRefusedBeforeRunning(self, r, out, message, label=""):
        """run.sh exited 2 with ``message`` on stderr, nothing on stdout, and made no log
        folder ``out`` (it refused before running anything)."""
        self.assertEqual(r.returncode, 2, label + r.stdout + r.stderr)
        self.assertEqual(r.stdout, "", label)
        self.assertIn(message, r.stderr)
        self.assertFalse(os.path.exists(out), "it ran something before refusing")
    def test_without_a_gpu_the_unit_tests_run_and_it_exits_0(self):
        d, env = self.fake_bundle("SKIPPED: no CUDA driver or GPU (error 35: x)", False)
        r = self.run_sh(d, env)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("kernel: %s" % os.uname().release, r.stdout)
        self.assertIn("budgets (s)", r.stdout)
        self.assertEqual(r.stdout.count("[  PASSED  ] 1 test."), 2, r.stdout)
        self.assertIn("SKIPPED: no usable CUDA driver/GPU here", r.stdout)
        self.assertNotIn("FAIL", r.stdout)

    def test_skipped_while_nvidia_smi_lists_a_gpu_fails(self):
        # Also: the daemon (shm, as the binaries cannot use the GPU) ignores SIGTERM; it is
        # killed after GPU_CHECK_STOP_GRACE_S (2 s here, 10 by default).
        d, env = self.fake_bundle("SKIPPED: no CUDA driver or GPU (error 35: x)", True,
                                  deaf_daemon=True)
        env["GPU_CHECK_STOP_GRACE_S"] = "2"
        r = self.run_sh(d, env)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("FAIL: kernels printed SKIPPED while nvidia-smi lists a GPU", r.stdout)
        self.assertIn("driver is older than the bundle's CUDA runtime", r.stdout)
        self.assertIn("NOTE: the bundle's CUDA binaries cannot use the listed GPU", r.stdout)
        for name in ("ipc", "calib_measured", "calib_model"):
            self.assertIn("NOT RUN: %s (the bundle's CUDA binaries cannot use this GPU)\n" % name,
                          r.stdout)
        self.assertIn("NOT RUN: ipc_cross_uid needs CUDA IPC (the bundle's CUDA binaries cannot "
                      "use this GPU)\n", r.stdout)
        self.assertIn("starting offloadd (backend shm", r.stdout)
        self.assertIn("== stopping offloadd (SIGTERM; killed after 2 s)\n", r.stdout)
        self.assertIn("FAIL: offloadd did not exit within 2 s of SIGTERM: killed", r.stdout)

    def test_a_step_that_does_not_fit_the_deadline_is_not_run(self):
        d, env = self.fake_bundle("PASS kernels", True)
        env["GPU_CHECK_DEADLINE_S"] = "28"   # budgets x3: unit_engine (30 s) and kernels (45 s)
        r = self.run_sh(d, env)              # do not fit, unit_export (24 s) does
        self.assertIn("NOTE: the budgets", r.stdout)
        self.assertRegex(r.stdout, r"NOT RUN \(budget\): unit_engine needs 30 s, \d+ s left "
                                   r"before the 28 s deadline")
        self.assertEqual(r.stdout.count("[  PASSED  ] 1 test."), 1, r.stdout)
        self.assertRegex(r.stdout, r"NOT RUN \(budget\): kernels needs 45 s")
        self.assertIn("RESULT: the deadline left no time to find out whether a GPU is usable",
                      r.stdout)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        # Every step but unit_export (it passed) is to be rerun: those after kernels never ran.
        redo = [(n, s) for n, s in budgets() if n != "unit_export"]
        self.assertIn("RERUN the failed and not-run steps (%d s by the budgets): "
                      "GPU_CHECK_BUDGET_SCALE=300 GPU_CHECK_ONLY=%s bash %s/run.sh\n"
                      % (3 * (sum(s for _, s in redo) + RESERVE_S), ",".join(n for n, _ in redo), d),
                      r.stdout)

    def test_only_one_step_runs_that_step_alone(self):
        d, env = self.fake_bundle("SKIPPED: no CUDA driver or GPU (error 35: x)", False)
        env["GPU_CHECK_ONLY"] = "unit_export"
        r = self.run_sh(d, env)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        # Its budget (8 s x3) and the reserve, not the 546 s of a full run.
        self.assertIn("== deadline %d s; step budgets (s), 24 in all, reserve %d:\n   unit_export:24\n"
                      % (24 + 3 * RESERVE_S, 3 * RESERVE_S), r.stdout)
        self.assertIn("[unit_export] [  PASSED  ] 1 test.", r.stdout)
        self.assertRegex(r.stdout, r"\(unit_export: \d+ s of 24 s\)")
        self.assertEqual(r.stdout.count("[  PASSED  ] 1 test."), 1, r.stdout)
        for other in ("unit_engine", "kernels", "ipc", "python_env"):
            self.assertNotIn("[%s]" % other, r.stdout)
            self.assertNotIn("(%s:" % other, r.stdout)
        self.assertNotIn("SKIPPED", r.stdout)   # the kernels check did not run
        self.assertNotIn("RERUN", r.stdout)
        self.assertTrue(r.stdout.endswith("RESULT: the chosen GPU checks passed (unit_export)\n"),
                        r.stdout)

    def test_only_adds_what_the_chosen_steps_need(self):
        d, env = self.fake_bundle("SKIPPED: no CUDA driver or GPU (error 35: x)", False)
        env["GPU_CHECK_ONLY"] = "torch_on, health1"
        r = self.run_sh(d, env)
        need = ["kernels", "ipc", "python_warm", "python_env", "daemon_start", "free_mid",
                "health1", "torch_on", "stop"]
        self.assertIn("only %s (the steps named and what they need)" % " ".join(need), r.stdout)
        b = dict(budgets())
        self.assertIn("== deadline %d s; step budgets (s), %d in all"
                      % (3 * (sum(b[n] for n in need) + RESERVE_S), 3 * sum(b[n] for n in need)),
                      r.stdout)
        # The kernels check ran (and found no GPU), the unit tests did not; the chosen steps did
        # not run, which the ending says, exiting 2 as for any step not run.
        self.assertIn("[kernels] SKIPPED: no CUDA driver or GPU", r.stdout)
        self.assertNotIn("[  PASSED  ]", r.stdout)
        self.assertNotIn("unit tests above ran", r.stdout)
        b3 = 3 * (sum(b[n] for n in need) + RESERVE_S)
        self.assertTrue(r.stdout.endswith(
            "SKIPPED: no usable CUDA driver/GPU here, so these chosen steps did not run: %s\n"
            "RERUN the failed and not-run steps (%d s by the budgets): GPU_CHECK_BUDGET_SCALE=300 "
            "GPU_CHECK_ONLY=%s bash %s/run.sh\n"
            "RESULT: 0 failure(s), %d step(s) not run (no usable CUDA driver/GPU)\n"
            % (" ".join(need), b3, ",".join(need), d, len(need))), r.stdout)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)

    def test_an_unknown_step_exits_2_naming_the_steps(self):
        d, env = self.fake_bundle("PASS kernels", False)
        env["GPU_CHECK_ONLY"] = "torch_on,torch_of"
        r = self.run_sh(d, env)
        self.assertRefusedBeforeRunning(
            r, env["OUT"], "GPU_CHECK_ONLY names 'torch_of', which is no step; the steps are: %s "
            % " ".join(n for n, _ in budgets()))

    def test_only_without_a_driver_runs_the_chosen_unit_tests_and_exits_2(self):
        d, env = self.fake_bundle("SKIPPED: no CUDA driver or GPU (error 35: x)", False)
        env["GPU_CHECK_ONLY"] = "unit_export,spin"
        r = self.run_sh(d, env)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertEqual(r.stdout.count("[  PASSED  ] 1 test."), 1, r.stdout)
        self.assertIn(
            "SKIPPED: no usable CUDA driver/GPU here, so these chosen steps did not run: kernels "
            "ipc daemon_start spin stop (the chosen unit tests above ran)\nRERUN ", r.stdout)
        self.assertTrue(r.stdout.endswith(
            "RESULT: 0 failure(s), 5 step(s) not run (no usable CUDA driver/GPU)\n"), r.stdout)

    def rerun_names(self, stdout):
        """The step names of the RERUN line, which comes right before the RESULT line."""
        lines = stdout.splitlines()
        self.assertTrue(lines[-1].startswith("RESULT: "), stdout)
        m = re.match(r"RERUN the failed and not-run steps \(\d+ s by the budgets\): "
                     r"GPU_CHECK_BUDGET_SCALE=300 GPU_CHECK_ONLY=(\S+) bash ", lines[-2])
        self.assertTrue(m, stdout)
        return m.group(1).split(",")

    def test_only_without_a_driver_names_every_step_to_rerun(self):
        d, env = self.fake_bundle("SKIPPED: no CUDA driver or GPU (error 35: x)", False)
        env["GPU_CHECK_ONLY"] = "unit_engine,torch_on"
        r = self.run_sh(d, env)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertEqual(self.rerun_names(r.stdout), ["kernels", "ipc", "python_warm",
                         "python_env", "daemon_start", "torch_on", "stop"])
        self.assertEqual(r.stdout.splitlines()[-1],
                         "RESULT: 0 failure(s), 7 step(s) not run (no usable CUDA driver/GPU)")
        # A failed unit test is named with the steps that did not run.
        d, env = self.fake_bundle("SKIPPED: no CUDA driver or GPU (error 35: x)", False,
                                  export_fails=True)
        env["GPU_CHECK_ONLY"] = "unit_export,galore"
        r = self.run_sh(d, env)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertEqual(self.rerun_names(r.stdout), ["unit_export", "kernels", "ipc",
                         "python_warm", "python_env", "daemon_start", "galore", "stop"])
        self.assertEqual(r.stdout.splitlines()[-1],
                         "RESULT: 1 failure(s), 7 step(s) not run (no usable CUDA driver/GPU)")

    def test_without_a_driver_a_full_run_ends_with_a_result_line(self):
        d, env = self.fake_bundle("SKIPPED: no CUDA driver or GPU (error 35: x)", False,
                                  export_fails=True)
        r = self.run_sh(d, env)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertEqual(self.rerun_names(r.stdout), ["unit_export"])
        self.assertEqual(r.stdout.splitlines()[-1], "RESULT: 1 failure(s) in the unit tests; no "
                         "usable CUDA driver/GPU for the rest")

    def test_only_splits_names_at_any_whitespace_and_commas(self):
        d, env = self.fake_bundle("PASS kernels", False)
        env["GPU_CHECK_ONLY"] = "unit_export\n\tunit_engine,\r\n"
        r = self.run_sh(d, env)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("only unit_engine unit_export (the steps named", r.stdout)
        self.assertEqual(r.stdout.count("[  PASSED  ] 1 test."), 2, r.stdout)
        # A name on a later line is checked too.
        env["GPU_CHECK_ONLY"] = "kernels\nbogus"
        r = self.run_sh(d, env)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertEqual(r.stdout, "")
        self.assertIn("GPU_CHECK_ONLY names 'bogus', which is no step", r.stderr)

    def test_only_names_each_step_once_in_its_header(self):
        d, env = self.fake_bundle("PASS kernels", False)
        env["GPU_CHECK_ONLY"] = "unit_export,unit_engine unit_export,unit_export"
        r = self.run_sh(d, env)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("== GPU_CHECK_ONLY=unit_export,unit_engine: only unit_engine unit_export "
                      "(the steps named", r.stdout)
        self.assertEqual(r.stdout.count("[  PASSED  ] 1 test."), 2, r.stdout)

    def test_only_with_separators_and_no_name_exits_2(self):
        d, env = self.fake_bundle("PASS kernels", False)
        for value in (" , ", "\n", ",", "\t \n,"):
            env["GPU_CHECK_ONLY"] = value
            r = self.run_sh(d, env)
            self.assertRefusedBeforeRunning(
                r, env["OUT"], "GPU_CHECK_ONLY names no step (it holds only separators): leave "
                "it unset or empty to run every step, or name steps among: %s"
                % " ".join(n for n, _ in budgets()), repr(value))

    def test_every_unknown_name_is_reported_at_once(self):
        d, env = self.fake_bundle("PASS kernels", False)
        env["GPU_CHECK_ONLY"] = "foo kernels bar,baz"
        r = self.run_sh(d, env)
        self.assertRefusedBeforeRunning(
            r, env["OUT"], "GPU_CHECK_ONLY names 'foo', 'bar' and 'baz', which are no steps; the "
            "steps are: %s " % " ".join(n for n, _ in budgets()))
        self.assertEqual(r.stderr.count("run.sh:"), 1, r.stderr)

    def test_every_chosen_step_not_run_says_so_and_is_counted(self):
        d, env = self.fake_bundle("PASS kernels", True, no_ipc=True)
        env["GPU_CHECK_ONLY"] = "health1"
        r = self.run_sh(d, env)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("NOT RUN: free_mid needs CUDA IPC (IPC unsupported in this sandbox)\n",
                      r.stdout)
        self.assertIn("NOT RUN: health1 needs CUDA IPC (IPC unsupported in this sandbox)\n",
                      r.stdout)
        self.assertEqual(r.stdout.count("\nNOT RUN"), 2, r.stdout)
        self.assertIn("RESULT: no failure, 2 step(s) not run\n", r.stdout)
        self.assertNotIn("FAIL", r.stdout)

    def test_without_a_bundle_it_says_how_to_make_one(self):
        # tests/gpu in the source tree has no bin/: the binaries are built by make gpu-bundle.
        self.assertFalse(os.path.exists(os.path.join(GPU, "bin")))
        out = os.path.join(tempfile.mkdtemp(prefix="ofd-gpu-src-"), "out")
        self.addCleanup(shutil.rmtree, os.path.dirname(out), True)
        r = subprocess.run(["bash", RUN_SH], env=dict(os.environ, OUT=out), capture_output=True,
                           text=True, timeout=60)
        self.assertRefusedBeforeRunning(
            r, out, "run.sh: no bin/ beside %s: this script runs from the GPU bundle: build it "
            "with `make gpu-bundle` and run gpu-bundle/run.sh" % GPU)

    def test_a_budget_scale_that_is_no_positive_whole_number_exits_2(self):
        d, env = self.fake_bundle("PASS kernels", False)
        for value in ("abc", "0", "00", "-5", "1.5", "0x8"):
            env["GPU_CHECK_BUDGET_SCALE"] = value
            r = self.run_sh(d, env)
            self.assertRefusedBeforeRunning(
                r, env["OUT"], "run.sh: GPU_CHECK_BUDGET_SCALE=%r is no positive whole number of "
                "percent (100: the budgets as they are, 200: twice as long)" % value, repr(value))
            self.assertNotIn("unbound variable", r.stderr)

    def test_a_small_budget_scale_still_limits_every_step(self):
        # Scale 1: 8 s x 1 % would round to 0 s, and `timeout 0` sets no limit at all.
        d, env = self.fake_bundle("PASS kernels", False)
        write_exe(os.path.join(d, "bin", "cuda_export_test"), "sleep 6; echo done")
        env.update(GPU_CHECK_BUDGET_SCALE="1", GPU_CHECK_ONLY="unit_export")
        r = self.run_sh(d, env)
        self.assertIn("== deadline 2 s; step budgets (s), 1 in all, reserve 1:\n   unit_export:1\n",
                      r.stdout)
        self.assertIn("FAIL: unit_export ran past its 1 s budget", r.stdout)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        # A full run's default deadline covers the budgets rounded up to 1 s each.
        d, env = self.fake_bundle("SKIPPED: no CUDA driver or GPU (error 35: x)", False)
        env["GPU_CHECK_BUDGET_SCALE"] = "1"
        r = self.run_sh(d, env)
        n = len(budgets())
        self.assertIn("== deadline %d s; step budgets (s), %d in all, reserve 1:\n" % (n + 1, n),
                      r.stdout)

    def test_leading_zeros_are_read_as_decimal(self):
        # 08 and 09 are no octal numbers: bash arithmetic would refuse them.
        d, env = self.fake_bundle("PASS kernels", False)
        env.update(GPU_CHECK_BUDGET_SCALE="0200", GPU_CHECK_ONLY="unit_export",
                   GPU_CHECK_DEADLINE_S="0099")
        r = self.run_sh(d, env)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("== deadline 99 s; step budgets (s), 16 in all, reserve 83:\n"
                      "   unit_export:16\n", r.stdout)
        env.update(GPU_CHECK_BUDGET_SCALE="08", GPU_CHECK_DEADLINE_S="09")
        r = self.run_sh(d, env)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("== deadline 9 s; step budgets (s), 1 in all, reserve 8:\n", r.stdout)

    def test_a_budget_scale_or_deadline_too_large_exits_2(self):
        d, env = self.fake_bundle("PASS kernels", False)
        for value in ("10001", "99999999999999999999"):
            env["GPU_CHECK_BUDGET_SCALE"] = value
            r = self.run_sh(d, env)
            self.assertRefusedBeforeRunning(
                r, env["OUT"], "run.sh: GPU_CHECK_BUDGET_SCALE=%s is over 10000 percent (100 times "
                "the budgets): give at most 10000" % value, value)
        env["GPU_CHECK_BUDGET_SCALE"] = "10000"
        for value in ("86401", "99999999999999999999"):
            env["GPU_CHECK_DEADLINE_S"] = value
            r = self.run_sh(d, env)
            self.assertRefusedBeforeRunning(
                r, env["OUT"], "run.sh: GPU_CHECK_DEADLINE_S=%s is over 86400 seconds (a day): "
                "give at most 86400, or leave it unset for the default" % value, value)

    def test_a_stop_grace_that_is_no_whole_number_of_seconds_from_1_to_600_exits_2(self):
        d, env = self.fake_bundle("PASS kernels", False)
        for value in ("0", "abc", "1.5", "-3", "601", "99999999999999999999"):
            env["GPU_CHECK_STOP_GRACE_S"] = value
            r = self.run_sh(d, env)
            self.assertRefusedBeforeRunning(
                r, env["OUT"], "run.sh: GPU_CHECK_STOP_GRACE_S='%s' is no whole number of seconds "
                "from 1 to 600 (leave it unset for the default, 10)" % value, value)

    def test_the_header_names_the_no_driver_ending_the_script_prints(self):
        text = open(RUN_SH).read()
        header = text[:text.index("\nset -u")]
        ending = re.search(r'echo "(SKIPPED: no usable CUDA driver/GPU here)', text).group(1)
        self.assertIn('"%s' % ending, header.replace("\n# ", " "))
        self.assertNotIn("SKIPPED: no GPU", header)

    def test_a_failed_step_prints_the_command_that_reruns_it(self):
        d, env = self.fake_bundle("SKIPPED: no CUDA driver or GPU (error 35: x)", False,
                                  export_fails=True)
        r = self.run_sh(d, env)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        cmd = "GPU_CHECK_BUDGET_SCALE=300 GPU_CHECK_ONLY=unit_export bash %s/run.sh" % d
        self.assertIn("RERUN the failed and not-run steps (%d s by the budgets): %s\n"
                      % (3 * (8 + RESERVE_S), cmd), r.stdout)
        # The command runs just that step (and fails again, saying the same).
        again = subprocess.run(["bash", "-c", cmd], env=env, capture_output=True, text=True,
                               timeout=120)
        self.assertEqual(again.returncode, 1, again.stdout + again.stderr)
        self.assertIn("FAIL: unit_export exited 1", again.stdout)
        self.assertNotIn("[unit_engine]", again.stdout)
        self.assertNotIn("[kernels]", again.stdout)
        self.assertIn("GPU_CHECK_ONLY=unit_export bash %s/run.sh\n" % d, again.stdout)


STUB_PY = """import os, sys
conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "unset")
print("PASS %s stub with %s" % (os.path.basename(sys.argv[0]), conf))
print("FIGURE stub_%s_%s 1 x" % (os.path.basename(sys.argv[0]).split(".")[0], conf.split(":")[-1]))
"""


class RunShGpuPathTest(unittest.TestCase):
    """run.sh's GPU path on stand-ins: nvidia-smi lists a GPU, the check binaries print what the
    real ones print, the daemon is the real one on backend shm (its cuda flags mapped), the
    Python checks are stubs that echo the allocator setting they ran under."""

    def build_wheel(self, d):
        """The wheel as `make wheel` builds it, in d/wheel, from a copy of client/python with its
        stubs (test_packaging builds one in the tree meanwhile: setuptools' build/ is there)."""
        src = os.path.join(d, "src")
        shutil.copytree(PY_ROOT, src, ignore=shutil.ignore_patterns(
            "build", "*.egg-info", "__pycache__", "tests", "examples"))
        cores = [os.path.join(REPO, p, "client", "core", "liboffloadd_core.so")
                 for p in ("bazel-bin", os.path.join("bazel-out", "k8-opt", "bin"))]
        core = next((c for c in cores if os.path.exists(c)), cores[0])
        # The ring's extension module too (setup.py looks for it relative to its own copy,
        # which is not in the repository here).
        fast = next((c for c in (os.path.join(os.path.dirname(c), "ring_fast.so") for c in cores)
                     if os.path.exists(c)), None)
        env = dict(os.environ, OFFLOADD_CORE_LIB=core, OFFLOADD_STORE_FRONT_LIB=os.path.join(
            os.path.dirname(core), "store_front.so"))
        if fast is not None:
            env["OFFLOADD_RING_FAST_LIB"] = fast
        w = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                            "--no-build-isolation", "-w", os.path.join(d, "wheel"), src],
                           capture_output=True, text=True, timeout=300, env=env)
        self.assertEqual(w.returncode, 0, w.stderr[-3000:])
        shutil.rmtree(src)

    def bundle(self, ipc, busy_port=None, metrics_taken_once=False, wheel=False, only=None):
        """``wheel``: the client as make_gpu_bundle.sh ships it, a wheel in wheel/ (built here
        as `make wheel` does), instead of the package in python/. ``only``: GPU_CHECK_ONLY."""
        d = tempfile.mkdtemp(prefix="ofd-gpu-path-")
        self.addCleanup(shutil.rmtree, d, True)
        b = os.path.join(d, "bin")
        os.makedirs(b)
        os.makedirs(os.path.join(d, "lib"))
        shutil.copy(RUN_SH, d)
        if wheel:
            self.build_wheel(d)
            os.makedirs(os.path.join(d, "python"))
        else:
            copy_source_package(os.path.join(d, "python", "offloadd"))
        for name in ("torch_check.py", "transformers_check.py", "cuda_probes.py",
                     "galore_check.py", "compiled_check.py", "step_timing.py"):
            with open(os.path.join(d, name), "w") as f:
                f.write(STUB_PY)
        for name in ("cuda_engine_test", "cuda_export_test"):
            write_exe(os.path.join(b, name), 'echo "[  PASSED  ] 1 test."')
        write_exe(os.path.join(b, "kernels_gpu_check"), 'echo "PASS kernels"')
        write_exe(os.path.join(b, "copy_sim_bench"),
                  'k=measured; [[ " $* " == *" --backend=sim "* ]] && k=model\n'
                  'echo "FIGURE copy_${k}_sync_local_8MiB d2h 50.0 GB/s h2d 49.0 GB/s '
                  'urgent_reload_median 1.5 chunk-times"')
        write_exe(os.path.join(b, "gpu_probes"),
                  'case " $* " in *" --mode=ipc "*)\n'
                  + ('  echo "FIGURE ipc_open_us 150 us"; echo "PASS ipc";;\n' if ipc else
                     '  echo "IPC unsupported in this sandbox: cudaIpcOpenMemHandle: x (801)"; '
                     'exit 3;;\n')
                  + '*) echo "PASS probe $*";; esac')
        write_exe(os.path.join(b, "gpu_e2e"),
                  'echo OFFLOADING; echo "PASS data: e2e $*"; '
                  'echo "FIGURE daemon_d2h_GBps 40 GB/s"; sleep 0.2')
        taken = os.path.join(d, "metrics-taken")
        if metrics_taken_once:  # the first start finds its metrics port taken, as offloadd says
            open(taken, "w").close()
        write_exe(os.path.join(b, "offloadd"),
                  ('[ -e %s ] && [[ " $* " != *" --metrics_address= "* ]] && { rm %s; '
                   'echo "cannot serve metrics on x: in use" >&2; exit 1; }\n' % (taken, taken)
                   if metrics_taken_once else "") +
                  'echo "cuda: host pool pinned: 0 bytes (stand-in)"\n'
                  # The real daemon on shm, with a 512 MiB pool whatever run.sh sized from
                  # MemAvailable (up to 8 GiB, pre-faulted: on a 2-core machine running other
                  # tests that can take longer than the daemon_start budget).
                  'args=(); for a in "$@"; do case $a in --backend=cuda) a=--backend=shm;; '
                  '--pool_bytes=*) a=--pool_bytes=512MiB;; esac; args+=("$a"); done\n'
                  'exec "%s" "${args[@]}"' % daemon_bin())
        tools = os.path.join(d, "tools")
        os.makedirs(tools)
        write_exe(os.path.join(tools, "nvidia-smi"),
                  'case "$*" in -L*|--list-gpus*) echo "GPU 0: NVIDIA H200 (UUID: GPU-0)";; '
                  '*) echo "NVIDIA H200, GPU-0";; esac')
        env = dict(os.environ, PATH=tools + ":" + os.environ["PATH"], PYTHON=sys.executable,
                   OUT=os.path.join(d, "out"), GPU_CHECK_BUDGET_SCALE="300")
        if only is not None:
            env["GPU_CHECK_ONLY"] = only
        p = subprocess.Popen(["bash", os.path.join(d, "run.sh")], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        held = None
        if busy_port is not None:  # taken long before run.sh starts its daemon
            held = socket.socket()
            held.bind(("127.0.0.1", busy_port(p.pid)))
            held.listen(1)
        try:
            out, err = p.communicate(timeout=900)
        finally:
            if held is not None:
                held.close()
        return subprocess.CompletedProcess(p.args, p.returncode, out, err), out

    def test_ipc_supported_runs_every_step(self):
        r, out = self.bundle(ipc=True, wheel=True)
        self.assertEqual(r.returncode, 0, out + r.stderr)
        self.assertIn("RESULT: all GPU checks passed", out)
        self.assertNotIn("RERUN", out)
        # The client is the bundle's wheel, installed by pip into $OUT/site, native core included.
        site = os.path.join(re.search(r"logs in (\S+)\)", out).group(1), "site")
        self.assertRegex(out, r"python: offloadd-[0-9.]+-cp310-abi3-manylinux_2_\d+_x86_64\.whl "
                              r"installed with pip --no-deps into " + re.escape(site))
        self.assertIn("[python_env] NOTE offloadd from %s/offloadd\n" % site, out)
        self.assertIn("[python_env] NOTE offloadd native core %s/offloadd/liboffloadd_core.so\n"
                      % site, out)
        self.assertNotIn("NOT RUN", out)
        for name in ("context", "data_pair", "rates", "ordering", "spin", "free_mid", "health1",
                     "killed", "health2"):
            self.assertRegex(out, r"\(%s: \d+ s of \d+ s\)" % name)
        self.assertIn("[killed] PASS killed: the blocks of the killed client were released", out)
        self.assertIn("FIGURE pair_client1_daemon_d2h_GBps 40 GB/s", out)
        self.assertIn("FIGURE calib_sync_8MiB d2h measured 50.0 model 50.0 GB/s", out)
        for step, conf in (("torch_off", "False"), ("torch_on", "True"),
                           ("transformers_off", "False"), ("transformers_on", "True"),
                           ("probes_off", "False"), ("probes_on", "True")):
            self.assertRegex(out, r"\[%s\] PASS \w+\.py stub with expandable_segments:%s"
                             % (step, conf))
        # GaLore runs while the first daemon still serves (it needs it), before the clean stop.
        self.assertIn("[galore] PASS galore_check.py stub", out)
        self.assertIn("[compiled] PASS compiled_check.py stub with expandable_segments:False", out)
        self.assertIn("[step_timing] PASS step_timing.py stub with expandable_segments:False", out)
        self.assertLess(out.index("[transformers_on] PASS"), out.index("[step_timing] PASS"))
        self.assertLess(out.index("[galore] PASS"), out.index("== stopping offloadd"))

    def test_a_taken_port_does_not_keep_the_daemon_from_starting(self):
        # The port run.sh once derived from its PID, taken by another program. Only the daemon's
        # start, one health run and the stop with its handle count (every step runs in
        # test_ipc_supported_runs_every_step).
        r, out = self.bundle(ipc=True, busy_port=lambda pid: 20000 + pid % 20000, only="health2")
        self.assertEqual(r.returncode, 0, out + r.stderr)
        self.assertNotIn("did not start", out)
        self.assertIn("FIGURE ipc_handles_open_after_all_sessions 0 handles", out)

    def test_a_metrics_port_taken_at_the_start_leaves_the_daemon_without_metrics(self):
        r, out = self.bundle(ipc=True, metrics_taken_once=True, only="health2")  # as above
        self.assertEqual(r.returncode, 0, out + r.stderr)
        self.assertRegex(out, r"NOTE: metrics port \d+ taken: the daemon runs without metrics")
        self.assertIn("NOTE: could not scrape the daemon's metrics (metrics off)", out)
        self.assertNotIn("FAIL", out)

    def test_ipc_unsupported_says_so_and_runs_the_torch_checks_on_shm(self):
        r, out = self.bundle(ipc=False)
        self.assertEqual(r.returncode, 2, out + r.stderr)
        self.assertIn("IPC unsupported in this sandbox: steps that need it are NOT RUN", out)
        self.assertIn("starting offloadd (backend shm", out)
        self.assertIn("NOT RUN: spin needs CUDA IPC (IPC unsupported in this sandbox)", out)
        self.assertIn("[torch_on] PASS torch_check.py stub with expandable_segments:True", out)
        self.assertIn("RESULT: IPC unsupported in this sandbox", out)
        self.assertNotIn("FAIL", out)
        # The steps that need IPC, to rerun; with them what they need (the probe, the daemon,
        # the Python set-up for the probes), whose budgets the seconds add.
        redo = ["ipc_cross_uid", "context", "data_pair", "rates", "ordering", "spin", "free_mid",
                "health1", "killed", "probes_off", "probes_on", "health2"]
        b = dict(budgets())
        need_s = sum(b[n] for n in redo + ["kernels", "ipc", "python_warm", "python_env",
                                           "daemon_start", "stop"])
        self.assertRegex(out, r"\nRERUN the failed and not-run steps \(%d s by the budgets\): "
                              r"GPU_CHECK_BUDGET_SCALE=300 GPU_CHECK_ONLY=%s bash \S+/run.sh\n"
                              % (3 * (need_s + RESERVE_S), ",".join(redo)))

    def test_only_one_torch_check_runs_it_with_the_daemon_and_python(self):
        r, out = self.bundle(ipc=True, only="torch_on")
        self.assertEqual(r.returncode, 0, out + r.stderr)
        self.assertIn("[torch_on] PASS torch_check.py stub with expandable_segments:True", out)
        self.assertIn("FIGURE stub_torch_check_True 1 x", out)
        # What it needs ran: the kernels check, the IPC probe, Python, the daemon and its stop.
        for name in ("kernels", "ipc", "python_env"):
            self.assertRegex(out, r"\(%s: \d+ s of \d+ s\)" % name)
        self.assertIn("FIGURE ipc_open_us 150 us", out)
        self.assertIn("== starting offloadd (backend cuda", out)
        self.assertIn("== stopping offloadd", out)
        # Nothing else did.
        for name in ("unit_engine", "unit_export", "ipc_cross_uid", "calib_measured", "context",
                     "data_pair", "killed", "torch_off", "transformers_off", "transformers_on",
                     "step_timing", "compiled", "probes_off", "probes_on", "galore", "health2"):
            self.assertNotIn("[%s]" % name, out)
            self.assertNotIn("(%s:" % name, out)
        self.assertNotIn("stub_torch_check_False", out)
        self.assertNotIn("FIGURE calib_", out)
        self.assertNotIn("NOT RUN", out)
        self.assertNotIn("RERUN", out)
        self.assertIn("RESULT: the chosen GPU checks passed (kernels ipc python_warm python_env "
                      "daemon_start torch_on stop)", out)


class TorchCheckOnCpuTest(DaemonTestCase):
    POOL_BYTES = "256MiB"

    def test_torch_check_runs_on_cpu_and_reports_host_waits(self):
        r = subprocess.run(
            [sys.executable, os.path.join(GPU, "torch_check.py"), "--socket", self.daemon.sock,
             "--python-root", PY_ROOT, "--device", "cpu", "--seqs", "64", "--layers", "2",
             "--hidden", "64", "--heads", "4", "--steps", "2", "--threshold-bytes", "4096"],
            env=dict(os.environ, PYTHONPATH=PY_ROOT), capture_output=True, text=True,
            timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        self.assertNotIn("FAIL", r.stdout)
        self.assertIn("PASS seq 64: gradients bitwise equal", r.stdout)
        waits = [ln for ln in r.stdout.splitlines()
                 if ln.startswith("FIGURE host_waits_per_step_seq64_offloadd ")]
        self.assertEqual(len(waits), 1, r.stdout)
        # Either the client's counters or "n/a"; the reloads waited for are always counted.
        self.assertRegex(waits[0], r"offloadd (n/a|[0-9.]+) waits, (n/a|[0-9.]+) s .*"
                                   r"waited for: [0-9.]+, [0-9.]+ s")


class StepTimingOnCpuTest(DaemonTestCase):
    """step_timing.py's CPU stand-in (perf_counter for the CUDA events, nothing pinned, the
    side-stream anchor synchronous) against a real shm daemon: the small Qwen3 config (4 layers,
    hidden 256) at seq 64, fp32, whose layer inputs (64 KiB) are the only saved tensors above
    the 32 KiB threshold."""

    def run_script(self, *extra):
        return subprocess.run(
            [sys.executable, os.path.join(GPU, "step_timing.py"), "--socket", self.daemon.sock,
             "--python-root", PY_ROOT, "--fixture-dir", os.path.join(REPO, "client", "python",
                                                                      "tests"),
             "--device", "cpu", "--config", "small", "--seqs", "64",
             "--threshold-bytes", "32768"] + list(extra),
            env=dict(os.environ, PYTHONPATH=PY_ROOT), capture_output=True, text=True,
            timeout=300)

    @staticmethod
    def figures(stdout, name):
        """{mode: {key: value}} of the ``FIGURE <name> seq=64 mode=M k=v ...`` lines."""
        out = {}
        for line in stdout.splitlines():
            if line.startswith("FIGURE %s seq=64 " % name):
                kv = dict(w.split("=", 1) for w in line.split()[2:] if "=" in w)
                out.setdefault(kv.pop("mode"), []).append(kv)
        return out

    def test_every_mode_is_timed_and_offloadd_moves_every_layer_input(self):
        r = self.run_script("--steps", "2")
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        self.assertNotIn("FAIL", r.stdout)
        modes = ("ckpt", "save_on_cpu", "sidestream", "offloadd")
        for kind in ("step_timing_host", "step_timing_gpu"):
            f = self.figures(r.stdout, kind)
            self.assertEqual(sorted(f), sorted(modes), r.stdout)
            for m in modes:
                self.assertEqual(len(f[m]), 1, f)
                self.assertEqual(f[m][0]["steps"], "2")
                self.assertGreater(float(f[m][0]["median_ms"]), 0)
                self.assertGreater(float(f[m][0]["ratio"]), 0)
                self.assertLessEqual(float(f[m][0]["min_ms"]), float(f[m][0]["median_ms"]))
            self.assertEqual(f["ckpt"][0]["ratio"], "1.0000")
        launch = [ln.split() for ln in r.stdout.splitlines()
                  if ln.startswith("FIGURE step_timing_launch ")]
        self.assertEqual(len(launch), 1, r.stdout)
        kv = dict(w.split("=", 1) for w in launch[0][2:])
        self.assertEqual((kv["launches"], kv["device"]), ("3600", "cpu"))
        self.assertGreater(float(kv["host_us_per_launch"]), 0)
        self.assertLessEqual(float(kv["p10_us"]), float(kv["host_us_per_launch"]))
        self.assertLessEqual(float(kv["host_us_per_launch"]), float(kv["p90_us"]))
        counts = self.figures(r.stdout, "step_timing_counts")
        # 4 layer inputs a step, 2 timed steps: each sent, each reloaded, none kept in process.
        off = counts["offloadd"][0]
        self.assertEqual((off["offloaded"], off["reloaded"], off["fallbacks"], off["lost"]),
                         ("8", "8", "0", "0"), off)
        side = counts["sidestream"][0]
        self.assertEqual((side["offloaded"], side["reloaded"]), ("8", "8"), side)
        hooks = self.figures(r.stdout, "step_timing_hooks")
        self.assertEqual(sorted(hooks), ["offloadd", "save_on_cpu", "sidestream"])
        for m in ("offloadd", "sidestream"):  # 4 packs + 4 unpacks a step
            self.assertEqual(hooks[m][0]["ops_per_step"], "8.0", hooks)
            self.assertGreater(float(hooks[m][0]["train_us_per_op"]), 0)
        cpu = self.figures(r.stdout, "step_timing_client_cpu")
        self.assertEqual(sorted(cpu), ["offloadd", "save_on_cpu", "sidestream"])
        float(cpu["offloadd"][0]["us_per_op"])   # a difference of two noisy steps: any sign here
        self.assertIn("PASS step_timing seq=64: offloadd moved every tensor", r.stdout)

    def test_the_time_limit_stops_the_rounds_and_says_so(self):
        r = self.run_script("--steps", "20", "--warmup", "0", "--time-limit-s", "0")
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        self.assertIn("NOTE step_timing seq=64: time limit after 0 of 20 timed rounds", r.stdout)
        self.assertIn("NOTE step_timing seq=64: no timed round fit the time limit", r.stdout)
        figures = [ln for ln in r.stdout.splitlines() if ln.startswith("FIGURE")]
        self.assertEqual([ln.split()[1] for ln in figures], ["step_timing_launch"], r.stdout)


class CompiledCheckTest(unittest.TestCase):
    """compiled_check.py: skips cleanly without CUDA; on CPU (--device cpu) torch's compiled
    offload pass runs in its device_put form and its ao:: form raises (ao::offload asks
    torch.accelerator for the CPU device's stream), which the script reports without failing;
    offloadd.torch.compiled.backend runs with its gradients equal to the uncompiled function's."""

    def run_check(self, *extra):
        return subprocess.run(
            [sys.executable, os.path.join(GPU, "compiled_check.py"), "--socket", "/nonexistent",
             "--python-root", PY_ROOT] + list(extra),
            env=dict(os.environ, PYTHONPATH=PY_ROOT), capture_output=True, text=True, timeout=300)

    def test_skips_cleanly_without_cuda(self):
        import torch
        if torch.cuda.is_available():
            self.skipTest("CUDA is available here")
        r = self.run_check()
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("SKIPPED: torch.cuda.is_available() is False", r.stdout)

    def test_on_cpu_the_device_put_pass_runs_and_the_ao_ops_are_reported(self):
        r = self.run_check("--device", "cpu")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("NOTE ao_pass_sync on cpu: graph ops prims.device_put.default", r.stdout)
        self.assertIn("PASS ao_pass_sync: gradients equal the uncompiled function's", r.stdout)
        self.assertRegex(r.stdout, r"NOTE ao_pass_async on cpu: \w+Error: ")
        # No daemon at /nonexistent: the backend's offloads are kept in process (fallbacks).
        self.assertIn("PASS compiled_backend: 1 offload(s) inserted", r.stdout)
        self.assertNotIn("FAIL", r.stdout)


class CudaProbesWithoutCudaTest(unittest.TestCase):
    def test_skips_cleanly_without_cuda(self):
        r = subprocess.run(
            [sys.executable, os.path.join(GPU, "cuda_probes.py"), "--socket", "/nonexistent",
             "--python-root", PY_ROOT],
            env=dict(os.environ, PYTHONPATH=PY_ROOT), capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertTrue(r.stdout.startswith("SKIPPED: torch.cuda.is_available() is False"),
                        r.stdout)


if __name__ == "__main__":
    unittest.main()
