"""A lost step is one lost step (docs/failure-modes.md).

With the default anonymous pool a daemon SIGKILLed between forward and backward takes the step's
saved tensors with it: that backward raises OffloaddError DATA_LOSS. What must not follow:
  * later steps failing too -- here the same input tensor (an input batch reused across steps,
    1 MiB, fp32) is saved by every step; steps 2..n must be bitwise equal to the run without
    offload, with a new daemon serving from step 2 on, whether or not the caller still holds the
    failed step's graph;
  * the failed step's graph or saved-tensor handles outliving it: after the exception and the
    loss are dropped and gc runs, 0 handles of step 1 are alive and a weakref to its loss is dead;
  * exceptions that carry frames of the training step: every exception raised is a fresh object
    (never the same one twice), and the client's stored failures carry no traceback.

Run: tests/python/run.sh -k lost_step.
"""

import gc
import unittest
import warnings
import weakref

import torch
from daemon_fixture import Daemon

import offloadd.torch as ot
from offloadd import errors
from offloadd.torch import _endpoint

torch.set_num_threads(2)
ROWS, COLS = 256, 1024            # one saved tensor: 256 x 1024 x 4 = 1 MiB


def make_model(seed=0):
    g = torch.Generator().manual_seed(seed)
    w1 = torch.nn.Parameter(torch.randn(COLS, COLS, generator=g) / 32)
    w2 = torch.nn.Parameter(torch.randn(COLS, COLS, generator=g) / 32)
    return w1, w2


def forward(x, params):
    w1, w2 = params
    h = torch.relu(x @ w1)       # saves x (the reused input) and the matmul output
    return (h @ w2).square().mean()


def grads(params):
    return [p.grad.detach().clone() for p in params]


class LostStepTest(unittest.TestCase):
    def setUp(self):
        _endpoint.reset_for_tests()
        self.daemons = [Daemon("64MiB")]
        self.x = torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(1))

    def tearDown(self):
        _endpoint.reset_for_tests()
        for d in self.daemons:
            d.stop()

    def restart(self):
        first = self.daemons[-1]
        first.kill()
        self.daemons.append(Daemon("64MiB", sock=first.sock))

    def reference(self, steps):
        params = make_model()
        out = []
        for _ in range(steps):
            for p in params:
                p.grad = None
            loss = forward(self.x, params)
            loss.backward()
            out.append((loss.detach(), grads(params)))
        return out

    def lost_then_steps(self, steps, keep_failed_graph):
        """Step 1 loses its tensors (SIGKILL between forward and backward, a new daemon on the
        same socket); steps 2..n run with the same input. Returns (results of steps 2..n, the
        step-1 exception's code, weakref of step 1's loss, the context)."""
        ctx = ot.offload_checkpoints(socket_path=self.daemons[0].sock, keep_last_n=0)
        params = make_model()
        with ctx:
            loss = forward(self.x, params)
        self.assertTrue(ot.synchronize())
        self.assertEqual(self.daemons[-1].stats().blocks, 3)  # x, relu(x @ w1), h @ w2
        self.restart()
        code = None
        try:  # as a training loop would (unittest's assertRaises clears the frames)
            loss.backward()
        except errors.OffloaddError as e:
            code = e.code
        held = loss if keep_failed_graph else None
        lost = weakref.ref(loss)
        del loss
        out = []
        for _ in range(steps - 1):
            for p in params:
                p.grad = None
            with ctx:
                step_loss = forward(self.x, params)
            step_loss.backward()
            out.append((step_loss.detach(), grads(params)))
            del step_loss
        del held
        return out, code, lost, ctx

    def check_steps(self, out, ref):
        for i, ((loss, g), (rloss, rg)) in enumerate(zip(out, ref[1:])):
            self.assertTrue(torch.equal(loss, rloss), "step %d: loss differs" % (i + 2))
            self.assertTrue(all(torch.equal(a, b) for a, b in zip(g, rg)),
                            "step %d: gradients differ" % (i + 2))

    def test_later_steps_saving_the_same_input_are_exact(self):
        ref = self.reference(4)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out, code, lost, ctx = self.lost_then_steps(4, keep_failed_graph=False)
        self.assertEqual(code, errors.DATA_LOSS)
        self.check_steps(out, ref)
        self.assertEqual(ctx.stats.lost, 1)

    def test_later_steps_are_exact_while_the_failed_graph_is_held(self):
        ref = self.reference(3)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out, code, lost, ctx = self.lost_then_steps(3, keep_failed_graph=True)
        self.assertEqual(code, errors.DATA_LOSS)
        self.check_steps(out, ref)

    def test_nothing_of_the_failed_step_outlives_it(self):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out, code, lost, ctx = self.lost_then_steps(1, keep_failed_graph=False)
        self.assertEqual(code, errors.DATA_LOSS)
        gc.collect()
        self.assertIsNone(lost(), "the failed step's loss (and graph) is still referenced")
        self.assertEqual(ctx.store.live_handles(), 0)

    def test_exceptions_are_fresh_and_carry_no_frames(self):
        ctx = ot.offload_checkpoints(socket_path=self.daemons[0].sock, keep_last_n=0,
                                     retry_seconds=0.0)
        params = make_model()
        with ctx:
            loss = forward(self.x, params)
        self.assertTrue(ot.synchronize())
        client = _endpoint.endpoints()[0].client
        self.restart()
        raised = []
        for _ in range(2):  # the second backward reaches the same lost handle again
            try:
                loss.backward(retain_graph=True)
            except errors.OffloaddError as e:
                raised.append(e)
        self.assertEqual(len(raised), 2)
        self.assertIsNot(raised[0], raised[1])
        self.assertIsNone(raised[0].__context__)
        self.assertIsNone(raised[0].__cause__)
        # The dead client's stored failure and what its later requests raise: fresh, no frames.
        futures = [client.release(1), client.release(2)]
        excs = [f.exception() for f in futures]
        self.assertIsNot(excs[0], excs[1])
        for e in excs + [client._dead]:
            self.assertIsNone(e.__traceback__)


if __name__ == "__main__":
    unittest.main()
