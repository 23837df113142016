"""Test doubles of offloadd, kept out of the production modules.

* ``offloadd.testing.sim_gpu``  a simulated client GPU (device memory, a caching allocator,
  streams, IPC handles) that a ``--backend=cuda-sim`` daemon serves; importing it registers the
  "sim" device kind (offloadd._devices), so the torch hooks treat CPU tensors as its device's
  while one is active.
"""
