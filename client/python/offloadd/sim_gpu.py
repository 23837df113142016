"""Former home of offloadd.testing.sim_gpu (the simulated client GPU): this name is that module
itself, so ``from offloadd import sim_gpu`` keeps working and shares its state (the active GPU)."""

import sys

from .testing import sim_gpu as _sim_gpu

sys.modules[__name__] = _sim_gpu
