"""How the Python client settles a request left unanswered by a daemon that died (no daemon
needed: Client._settle_locked on a client without a connection)."""
import types
import unittest

from offloadd import errors
from offloadd.client import Client
from offloadd.v1 import offload_pb2 as pb


def bare_client(lost):
    """A Client with only what settling reads: the target and the blocks reported lost."""
    c = Client.__new__(Client)
    c.target = "unix:/tmp/offloadd-test.sock"
    c._lost = set(lost)
    return c


def pending(request):
    return types.SimpleNamespace(request=request)


class SettleTest(unittest.TestCase):
    def test_release_after_reload_cut_by_a_restart_is_unconfirmed_not_lost(self):
        # Block 7 was confirmed and is missing after the restart (so it is in _lost), but the
        # reload in flight was releasing it: the dead daemon may have copied and released it.
        c = bare_client(lost={7})
        verdict = c._settle_locked(
            pending(pb.Request(reload=pb.ReloadRequest(block_id=7, release_after=True))),
            resumed=set())
        self.assertIsInstance(verdict, errors.OffloaddError)
        self.assertEqual(verdict.code, errors.DATA_LOSS)
        self.assertIn("release_after", str(verdict))
        self.assertNotIn("confirmed stored", str(verdict))
        self.assertNotIn(7, c._lost)  # released by its own request: not reported lost later

    def test_plain_reload_of_a_missing_confirmed_block_is_lost(self):
        c = bare_client(lost={7})
        verdict = c._settle_locked(pending(pb.Request(reload=pb.ReloadRequest(block_id=7))),
                                   resumed=set())
        self.assertEqual(verdict.code, errors.DATA_LOSS)
        self.assertIn("confirmed stored", str(verdict))
        self.assertIn(7, c._lost)

    def test_release_after_reload_of_a_resumed_block_is_sent_again(self):
        c = bare_client(lost=set())
        self.assertIsNone(c._settle_locked(
            pending(pb.Request(reload=pb.ReloadRequest(block_id=7, release_after=True))),
            resumed={7}))


if __name__ == "__main__":
    unittest.main()
