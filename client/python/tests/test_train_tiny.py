"""The example trainer's daemon line (examples/train_tiny.py daemon_line): counts read
"1 session", "2 sessions", never "1 sessions"."""

import types
import unittest

import daemon_fixture  # noqa: F401  (puts examples/ on the import path)
import train_tiny


def _stats(offloads, reloads, sessions):
    return types.SimpleNamespace(backend="shm", offloads_total=offloads, reloads_total=reloads,
                                 pool_used_bytes=0, pool_capacity_bytes=4194304,
                                 pool_peak_used_bytes=1048576, sessions_open=sessions)


class DaemonLineTest(unittest.TestCase):
    def test_one_of_each_is_singular(self):
        self.assertEqual(
            train_tiny.daemon_line("unix:/tmp/d.sock", _stats(1, 1, 1)),
            "daemon unix:/tmp/d.sock (shm backend): 1 offload / 1 reload in total, pool 0 of "
            "4194304 bytes in use, peak 1048576, 1 session open (this process's included)")

    def test_other_counts_are_plural(self):
        line = train_tiny.daemon_line("unix:/tmp/d.sock", _stats(0, 3, 2))
        self.assertIn(": 0 offloads / 3 reloads in total", line)
        self.assertTrue(line.endswith(", 2 sessions open (this process's included)"), line)


if __name__ == "__main__":
    unittest.main()
