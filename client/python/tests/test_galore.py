"""offloadd.galore.ServiceProjector against a real daemon, compared with a projector computed by
torch.linalg.svd in the same test (the reference GaLore projector's rule, written out below).

Run: tests/python/run.sh -k galore (or the whole suite).
"""

import math
import unittest

from daemon_fixture import DaemonTestCase

import torch

from offloadd import errors
from offloadd.galore import ProjectorConnection, ServiceProjector


class TorchReferenceProjector:
    """The reference GaLore projector's rule with torch.linalg.svd (fp32 SVD, P in G's dtype):
    left side U[:, :r] (m x r), right side Vh[:r, :] (r x n); refreshed at iter % gap == 0."""

    def __init__(self, rank, update_proj_gap=200, scale=1.0, proj_type="std"):
        self.rank, self.gap, self.scale, self.proj_type = rank, update_proj_gap, scale, proj_type
        self.ortho_matrix = None
        self.side = None

    def _side(self, g):
        m, n = g.shape
        if self.proj_type == "std":
            return "right" if m >= n else "left"
        if self.proj_type == "reverse_std":
            return "left" if m >= n else "right"
        return self.proj_type

    def project(self, g, it):
        self.side = self._side(g)
        if self.ortho_matrix is None or it % self.gap == 0:
            u, _, vh = torch.linalg.svd(g.float(), full_matrices=False)
            p = u[:, :self.rank] if self.side == "left" else vh[:self.rank, :]
            self.ortho_matrix = p.to(g.dtype)
        if self.side == "left":
            return self.ortho_matrix.t() @ g
        return g @ self.ortho_matrix.t()

    def project_back(self, low):
        if self.side == "left":
            return (self.ortho_matrix @ low) * self.scale
        return (low @ self.ortho_matrix) * self.scale


def low_rank_plus_noise(m, n, k=12, decay=0.8, noise=1e-3, seed=0):
    """m x n fp32 gradient with singular values 10 * decay^i (i < k) plus Gaussian noise."""
    gen = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(m, k, generator=gen))
    v, _ = torch.linalg.qr(torch.randn(n, k, generator=gen))
    s = 10.0 * decay ** torch.arange(k, dtype=torch.float32)
    return (u * s) @ v.t() + noise * torch.randn(m, n, generator=gen)


def columns(ortho, side):
    """The projector's singular vectors as columns (side_dim x r), fp32."""
    return (ortho if side == "left" else ortho.t()).float()


def max_principal_angle_sine(p1, p2):
    """Spectral norm of (I - P1 P1^T) P2 for orthonormal columns P1, P2 (fp64)."""
    p1, p2 = p1.double(), p2.double()
    return torch.linalg.matrix_norm(p2 - p1 @ (p1.t() @ p2), ord=2).item()


def residual_ratio(g, cols, side, r):
    """rho = ||G - P P^T G|| / sqrt(sum_{i>r} sigma_i^2), with sigma from torch (fp64)."""
    g = g.double()
    p = cols.double()
    resid = g - p @ (p.t() @ g) if side == "left" else g - (g @ p) @ p.t()
    s = torch.linalg.svdvals(g)
    return (torch.linalg.matrix_norm(resid) / torch.sqrt((s[r:] ** 2).sum())).item()


class ServiceProjectorTest(DaemonTestCase):
    def setUp(self):
        super().setUp()
        torch.set_num_threads(1)
        self.connection = ProjectorConnection(self.daemon.sock, timeout_seconds=60)
        self.projectors = []

    def tearDown(self):
        for p in self.projectors:
            p.close()
        self.connection.close()

    def make(self, rank, **kwargs):
        p = ServiceProjector(rank, connection=self.connection, **kwargs)
        self.projectors.append(p)
        return p

    def test_exact_refresh_matches_torch_svd_on_every_side(self):
        for shape, proj_type in [((96, 40), "std"), ((40, 96), "std"), ((96, 40), "reverse_std"),
                                 ((40, 96), "left"), ((96, 40), "right")]:
            with self.subTest(shape=shape, proj_type=proj_type):
                g = low_rank_plus_noise(*shape, seed=shape[0])
                ours = self.make(8, proj_type=proj_type)
                ref = TorchReferenceProjector(8, proj_type=proj_type)
                low, low_ref = ours.project(g, 0), ref.project(g, 0)
                self.assertEqual(tuple(low.shape), tuple(low_ref.shape))
                self.assertEqual(tuple(ours.ortho_matrix.shape), tuple(ref.ortho_matrix.shape))
                side = ref.side
                p, p_ref = columns(ours.ortho_matrix, side), columns(ref.ortho_matrix, side)
                self.assertLess(max_principal_angle_sine(p_ref, p), 1e-3)
                self.assertLessEqual(residual_ratio(g, p, side, 8), 1.05)
                eye = torch.eye(8, dtype=torch.float64)
                self.assertLessEqual((p.double().t() @ p.double() - eye).abs().max().item(), 1e-5)
                # The full-rank image does not depend on singular-vector signs.
                back, back_ref = ours.project_back(low), ref.project_back(low_ref)
                self.assertLess((back - back_ref).abs().max().item(), 1e-3)
                res = ours.last_result
                self.assertTrue(res.projector_written)
                self.assertLessEqual(res.residual_ratio, 1.05)
                self.assertLessEqual(res.orthogonality_error, 1e-5)
                self.assertEqual(len(res.singular_values), 8)
                sv_ref = torch.linalg.svdvals(g.double())[:8]
                for a, b in zip(res.singular_values, sv_ref.tolist()):
                    self.assertAlmostEqual(a, b, delta=1e-4 * sv_ref[0].item())

    def test_refreshes_every_gap_like_the_reference(self):
        gap, steps = 3, 8
        ours = self.make(6, update_proj_gap=gap, scale=0.25)
        ref = TorchReferenceProjector(6, update_proj_gap=gap, scale=0.25)
        refreshed = []
        for step in range(steps):
            g = low_rank_plus_noise(64, 48, seed=100 + step)  # the subspace moves every step
            before = ours.last_result
            back = ours.project_back(ours.project(g, step))
            back_ref = ref.project_back(ref.project(g, step))
            if ours.last_result is not before:
                refreshed.append(step)
            self.assertLess((back - back_ref).abs().max().item(), 1e-3, step)
        self.assertEqual(refreshed, [0, 3, 6])

    def test_bf16_gradient_gets_a_bf16_projector(self):
        g = low_rank_plus_noise(80, 48, seed=7).to(torch.bfloat16)
        ours = self.make(8)
        ref = TorchReferenceProjector(8)
        low = ours.project(g, 0)
        ref.project(g, 0)
        self.assertEqual(ours.ortho_matrix.dtype, torch.bfloat16)
        self.assertEqual(low.dtype, torch.bfloat16)
        p, p_ref = columns(ours.ortho_matrix, "right"), columns(ref.ortho_matrix, "right")
        self.assertLess(max_principal_angle_sine(p_ref, p), 2e-2)  # bf16 rounding of P
        err = (p.double().t() @ p.double() - torch.eye(8, dtype=torch.float64)).abs().max().item()
        self.assertAlmostEqual(ours.last_result.orthogonality_error, err, delta=1e-6)

    def test_float64_gradient_is_computed_in_fp32_and_cast_back(self):
        g = low_rank_plus_noise(48, 64, seed=8).double()
        ours = self.make(4)
        ours.project(g, 0)
        self.assertEqual(ours.ortho_matrix.dtype, torch.float64)
        ref = TorchReferenceProjector(4)
        ref.project(g, 0)
        self.assertLess(max_principal_angle_sine(columns(ref.ortho_matrix, "left"),
                                                 columns(ours.ortho_matrix, "left")), 1e-3)

    def test_asynchronous_mode_adopts_at_the_rule_step(self):
        gap = 4
        ours = self.make(6, update_proj_gap=gap, asynchronous=True)  # k = gap // 2 = 2
        self.assertEqual(ours.adopt_after_steps, 2)
        g0 = low_rank_plus_noise(64, 40, seed=20)
        ours.project(g0, 0)  # the first refresh waits: there is nothing to use yet
        self.assertFalse(ours.pending)
        p0 = ours.ortho_matrix.clone()
        g1 = low_rank_plus_noise(64, 40, seed=21)  # another subspace
        low = ours.project(g1, gap)  # submits and returns at once
        self.assertTrue(ours.pending)
        self.assertEqual(ours.pending_adopt_step, gap + 2)
        self.assertTrue(torch.equal(ours.ortho_matrix, p0))  # still the old projector
        self.assertTrue(torch.allclose(low, g1 @ p0.t()))
        import time
        time.sleep(0.5)  # the result is in long before step gap + 2: still not adopted early
        ours.project(g1, gap + 1)
        self.assertTrue(ours.pending)
        self.assertTrue(torch.equal(ours.ortho_matrix, p0))
        low = ours.project(g1, gap + 2)  # the rule's step: adopted (waiting if need be)
        self.assertFalse(ours.pending)
        p1 = ours.ortho_matrix
        self.assertTrue(torch.allclose(low, g1 @ p1.t()))
        ref = TorchReferenceProjector(6)
        ref.project(g1, 0)
        self.assertGreater(max_principal_angle_sine(columns(p0, "right"), columns(p1, "right")),
                           0.5)
        self.assertLess(max_principal_angle_sine(columns(ref.ortho_matrix, "right"),
                                                 columns(p1, "right")), 1e-3)
        self.assertEqual(ours.adopted_steps, [0, gap + 2])

    def test_prefetch_submits_each_waited_refresh_once_and_nothing_else(self):
        gap = 3
        ours = self.make(6, update_proj_gap=gap)  # synchronous: steps 0, 3, 6 wait
        ref = TorchReferenceProjector(6, update_proj_gap=gap)
        for step in range(7):
            g = low_rank_plus_noise(64, 40, seed=40 + step)
            before = ours.stats.refreshes_submitted
            ours.prefetch(g, step)
            due = step % gap == 0
            self.assertEqual(ours._prefetched is not None, due, step)
            if due:  # counted once the daemon answered the Submit (in the background)
                ours._prefetched["future"].result(timeout=30)
            self.assertEqual(ours.stats.refreshes_submitted, before + int(due), step)
            ours.prefetch(g, step)  # a second call submits nothing more
            back = ours.project_back(ours.project(g, step))  # takes the prefetched refresh
            self.assertEqual(ours.stats.refreshes_submitted, before + int(due), step)
            back_ref = ref.project_back(ref.project(g, step))
            self.assertLess((back - back_ref).abs().max().item(), 1e-3, step)
        # Prefetched for another step than project() is called with: submitted again for it.
        g = low_rank_plus_noise(64, 40, seed=60)
        ours.prefetch(low_rank_plus_noise(64, 40, seed=61), 9)
        ours._prefetched["future"].result(timeout=30)  # its Submit answered and counted
        before = ours.stats.refreshes_submitted
        ours.project(g, 12)
        self.assertEqual(ours.stats.refreshes_submitted, before + 1)
        ref.project(g, 12)
        self.assertLess(max_principal_angle_sine(columns(ref.ortho_matrix, "right"),
                                                 columns(ours.ortho_matrix, "right")), 1e-3)
        # Asynchronous: only the first refresh waits, so only it is prefetched.
        later = self.make(6, update_proj_gap=gap, asynchronous=True)
        g = low_rank_plus_noise(64, 40, seed=70)
        later.prefetch(g, 0)
        later._prefetched["future"].result(timeout=30)
        self.assertEqual(later.stats.refreshes_submitted, 1)
        later.project(g, 0)
        self.assertEqual(later.adopted_steps, [0])
        later.prefetch(g, gap)
        self.assertEqual(later.stats.refreshes_submitted, 1)
        later.project(g, gap)  # submitted here (in the background), adopted later
        later._pending["future"].result(timeout=30)
        self.assertEqual(later.stats.refreshes_submitted, 2)

    def test_randomized_with_warm_start(self):
        g = low_rank_plus_noise(128, 96, k=20, decay=0.85, seed=30)
        ours = self.make(8, method="randomized", warm_start=True, update_proj_gap=1)
        ours.project(g, 0)
        self.assertFalse(ours.last_result.warm_started)
        self.assertLessEqual(residual_ratio(g, columns(ours.ortho_matrix, "right"), "right", 8),
                             1.05)
        ours.project(g, 1)
        self.assertTrue(ours.last_result.warm_started)
        self.assertTrue(ours.last_result.has_similarity)
        self.assertGreater(ours.last_result.similarity, 0.999)
        self.assertTrue(math.isnan(ours.last_result.residual_ratio))  # unknown for randomized
        self.assertLessEqual(ours.last_result.residual_ratio_upper_bound, 2.0)

    def test_nan_gradient_is_invalid_argument_naming_the_row(self):
        g = low_rank_plus_noise(32, 24, seed=40)
        g[11, 5] = float("nan")
        ours = self.make(4)
        with self.assertRaises(errors.OffloaddError) as cm:
            ours.project(g, 0)
        self.assertEqual(cm.exception.code, errors.INVALID_ARGUMENT)
        self.assertIn("row 11", cm.exception.message)

    def test_one_dimensional_gradient_is_rejected(self):
        ours = self.make(4)
        with self.assertRaises(errors.OffloaddError) as cm:
            ours.project(torch.randn(64), 0)
        self.assertEqual(cm.exception.code, errors.INVALID_ARGUMENT)
        self.assertIn("1-D", cm.exception.message)

    def test_all_zero_gradient_keeps_the_projector(self):
        ours = self.make(4, update_proj_gap=1)
        g = low_rank_plus_noise(40, 32, seed=50)
        ours.project(g, 0)
        p = ours.ortho_matrix.clone()
        ours.project(torch.zeros(40, 32), 1)
        self.assertTrue(ours.last_result.degenerate)
        self.assertTrue(torch.equal(ours.ortho_matrix, p))
        # With no projector yet: the identity's first columns.
        fresh = self.make(4)
        fresh.project(torch.zeros(40, 32), 0)
        self.assertTrue(torch.equal(fresh.ortho_matrix, torch.eye(32, 4).t()))

    def test_huge_magnitudes_are_fine(self):
        g = low_rank_plus_noise(48, 32, seed=60) * 1e30
        ours = self.make(4)
        ours.project(g, 0)
        self.assertTrue(ours.last_result.projector_written)
        self.assertGreater(ours.last_result.singular_values[0], 1e30)
        self.assertLessEqual(residual_ratio(g, columns(ours.ortho_matrix, "right"), "right", 4),
                             1.05)

    def test_lazy_mode_skips_a_stable_subspace(self):
        g = low_rank_plus_noise(48, 32, seed=70)
        ours = self.make(4, update_proj_gap=1, lazy=True)
        skipped = []
        for step in range(5):
            ours.project(g, step)
            skipped.append(ours.last_result.skipped)
        # Default policy: 2 stable refreshes, then skips (at most 4 in a row).
        self.assertEqual(skipped, [False, False, False, True, True])

    def test_watch_a_batch_and_deduplicate_a_repeated_step(self):
        a = self.make(4, parameter_id="watch-a", batch_prefix="watch-step-")
        b = self.make(4, parameter_id="watch-b", batch_prefix="watch-step-")
        a.project(low_rank_plus_noise(32, 24, seed=80), 0)
        b.project(low_rank_plus_noise(24, 32, seed=81), 0)
        progress = list(self.connection.watch("watch-step-0"))
        self.assertEqual([p.completed for p in progress], [1, 2])
        self.assertEqual({p.result.key.parameter_id for p in progress}, {"watch-a", "watch-b"})
        # The same (parameter, step) again with the same gradient (another micro-batch, or
        # another rank): its own refresh, the first one's P, no second SVD.
        first = a.last_result.refresh_id
        a.project(low_rank_plus_noise(32, 24, seed=80), 0)
        self.assertNotEqual(a.last_result.refresh_id, first)
        self.assertTrue(a.last_result.deduplicated)
        self.assertEqual(a.last_result.shared_from_refresh_id, first)
        # With another gradient: computed on its own.
        a.project(low_rank_plus_noise(32, 24, seed=82), 0)
        self.assertFalse(a.last_result.deduplicated)
        self.assertTrue(a.last_result.content_mismatch)
        stats = self.connection.stats()
        self.assertGreaterEqual(stats.deduplicated_total, 1)
        self.assertGreaterEqual(stats.content_mismatches_total, 1)

    def test_no_daemon_is_daemon_unavailable(self):
        conn = ProjectorConnection("/tmp/ofd-no-daemon-here.sock", timeout_seconds=5)
        try:
            with self.assertRaises(errors.DaemonUnavailable):
                ServiceProjector(4, connection=conn).project(torch.randn(8, 8), 0)
        finally:
            conn.close()


class FakeCudaRuntime:
    """offloadd.cuda.CudaRuntime's three calls the projector's CUDA path makes, on fake pointers:
    one allocation at 0x7f0000000000 of 64 MiB, handle bytes derived from the base."""

    BASE, SIZE = 0x7F0000000000, 64 << 20

    def __init__(self):
        self.calls = []

    def allocation_range(self, ptr):
        self.calls.append(("range", ptr))
        assert self.BASE <= ptr < self.BASE + self.SIZE
        return self.BASE, self.SIZE

    def ipc_mem_handle(self, base):
        self.calls.append(("handle", base))
        return base.to_bytes(8, "little") * 8

    def device_uuid(self, ordinal):
        self.calls.append(("uuid", ordinal))
        return "GPU-00000000-0000-0000-0000-00000000000%d" % ordinal


class CudaPathTest(unittest.TestCase):
    """The CUDA IPC data path on fakes (no GPU here): the request names the allocation base's
    handle, the buffer's offset in it and the GPU's UUID; G and P sit at that offset."""

    def test_request_names_the_allocation_base_and_offsets(self):
        from offloadd import galore as og
        rt = FakeCudaRuntime()
        ptr = rt.BASE + (3 << 20)  # the projector's buffer, 3 MiB into a caching-allocator segment
        handle, offset, uuid = og.cuda_region_fields(rt, ptr, 1)
        self.assertEqual(handle.cuda_ipc_handle, rt.BASE.to_bytes(8, "little") * 8)
        self.assertEqual(len(handle.cuda_ipc_handle), 64)
        self.assertEqual(handle.size_bytes, rt.SIZE)
        self.assertEqual((offset, uuid), (3 << 20, "GPU-00000000-0000-0000-0000-000000000001"))
        self.assertEqual(rt.calls, [("range", ptr), ("handle", rt.BASE), ("uuid", 1)])
        proj = og.ServiceProjector(8, parameter_id="w", job_id="job",
                                   connection=object.__new__(og.ProjectorConnection))
        g = torch.zeros(96, 40)
        req = proj._request(10, g, og.pb.DTYPE_FLOAT32, handle, offset, 96 * 40 * 4, uuid)
        self.assertEqual(req.gradient_region.WhichOneof("kind"), "cuda_ipc_handle")
        self.assertEqual(req.gradient_offset, 3 << 20)
        self.assertEqual(req.projector_offset, (3 << 20) + 96 * 40 * 4)
        self.assertEqual(req.device_id, uuid)
        self.assertEqual((req.key.job_id, req.key.parameter_id, req.key.step), ("job", "w", 10))


if __name__ == "__main__":
    unittest.main()
