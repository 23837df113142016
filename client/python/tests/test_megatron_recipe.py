"""Megatron-Core fine-grained activation offloading: what the README's recipe rests on.

Megatron-Core's fine-grained offloading (``TransformerConfig(fine_grained_activation_offloading=
True, offload_modules=[...])``, ``--fine-grained-activation-offloading``) cannot run on this
CPU-only host: its ``PipelineOffloadManager`` makes CUDA streams when it is built and enables
Transformer Engine's CPU-offload flag, so Megatron-Core raises without CUDA and without
Transformer Engine. What the README says about it is held against the pinned Megatron-Core
(0.16.1) here, so that a release that moves it fails this test:

* the manager pushes saved-tensor hooks of its own (``__enter__`` calls
  ``torch._C._autograd._push_saved_tensors_default_hooks(self.on_save_for_backward, ...)``):
  neither torch's ``save_on_cpu`` nor offloadd's contexts are involved, so
  ``offloadd.torch.enable()`` cannot reach it;
* the copies are ``ChunkOffloadHandler.offload(self, src_tensor, pin_memory=True,
  use_cpu_pool=True) -> state`` (device to pinned host, on Megatron's d2h stream) and
  ``ChunkOffloadHandler.reload(self, state, non_blocking=None) -> tensor`` (on its h2d
  stream): the patch point the recipe names;
* the manager makes CUDA streams when built (no run is possible here), and Transformer
  Engine's ``cpu_offload``, which ``__enter__`` needs, is absent from this environment.
"""

import importlib.util
import inspect
import unittest
import warnings


@unittest.skipUnless(importlib.util.find_spec("megatron") and
                     importlib.util.find_spec("megatron.core"), "megatron-core is not installed")
class MegatronFineGrainedOffloadRecipeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import megatron.core
            from megatron.core.pipeline_parallel import fine_grained_activation_offload as f
        cls.version = megatron.core.__version__
        cls.f = f

    def test_version_is_the_pinned_one(self):
        self.assertEqual(self.version, "0.16.1")

    def test_the_manager_pushes_its_own_saved_tensor_hooks(self):
        source = inspect.getsource(self.f.PipelineOffloadManager.__enter__)
        self.assertIn("_push_saved_tensors_default_hooks", source)
        self.assertIn("self.on_save_for_backward", source)
        self.assertNotIn("save_on_cpu", inspect.getsource(self.f))

    def test_the_patch_point_has_the_documented_signatures(self):
        handler = self.f.ChunkOffloadHandler
        self.assertEqual(str(inspect.signature(handler.offload)),
                         "(self, src_tensor, pin_memory=True, use_cpu_pool=True)")
        self.assertEqual(str(inspect.signature(handler.reload)),
                         "(self, state, non_blocking=None)")
        self.assertIn("cpu_backup.copy_(src_tensor", inspect.getsource(handler.offload))
        self.assertIn("gpu_tensor.copy_(cpu_backup", inspect.getsource(handler.reload))

    def test_it_needs_cuda_streams_and_transformer_engine(self):
        # Not constructed here: a failed CUDA initialisation would stay in this test process.
        source = inspect.getsource(self.f.PipelineOffloadManager.__init__)
        self.assertIn("self._d2h_stream = torch.cuda.Stream()", source)
        self.assertIn("TE CPU offload is not available",
                      inspect.getsource(self.f.PipelineOffloadManager.__enter__))
        if importlib.util.find_spec("transformer_engine") is None:
            from megatron.core.extensions import transformer_engine as te
            self.assertIsNone(getattr(te, "cpu_offload", None))


if __name__ == "__main__":
    unittest.main()
