"""The process's live stores, for what ends every store's step at once.

offloadd.torch._store adds each Store here; offloadd.torch.synchronize (offloadd.torch._endpoint)
and the store module's exit handler call :func:`finish_steps`. Kept apart from both so that
neither imports the other's module to reach it.
"""

import weakref

# Every Store of the process (weak: a store dies with its context).
STORES = weakref.WeakSet()


def finish_steps():
    """The idle-step check of every store's steps (one per thread) whose backward has begun
    (Store.finish_step)."""
    for store in list(STORES):
        try:
            store.finish_step()
        except Exception:  # interpreter shutdown
            pass
