"""Deferred cleanup of dead saved-tensor handles, on one background thread.

A saved-tensor handle's death (``Store._on_death``, offloadd/torch/_store.py) may run anywhere -- e.g. inside a GC pass triggered
while the current thread holds the client's or the staging arena's lock -- so it only enqueues
the work: ``queue.SimpleQueue.put`` is reentrant (documented as safe in __del__), and the locks
are taken later on the reaper thread. ``reaper.flush()`` waits for what was queued so far
(offloadd.torch.synchronize calls it).
"""

import os
import queue
import sys
import threading


class _Reaper:
    """A queue of callables run in order on a daemon thread."""

    def __init__(self):
        self._start()

    def _start(self):
        self._queue = queue.SimpleQueue()
        # Started here, not on first use: put() must take no lock (it runs inside __del__).
        self._thread = threading.Thread(target=self._run, args=(self._queue,),
                                        name="offloadd-reaper", daemon=True)
        self._thread.start()

    def after_fork_in_child(self):
        """A forked child has no reaper thread (threads do not survive fork): start a new one
        with an empty queue (the parent's pending work is the parent's)."""
        self._start()

    def put(self, fn):
        self._queue.put(fn)

    def flush(self, timeout=10.0):
        """Waits until the work queued so far has run. True if it did within ``timeout``."""
        done = threading.Event()
        self.put(done.set)
        return done.wait(timeout)

    def _run(self, q):
        while True:
            fn = q.get()
            try:
                fn()
            except Exception as e:  # a closed client at exit: the daemon frees on disconnect
                if sys is not None and sys.stderr is not None:
                    sys.stderr.write("offloadd: releasing a saved tensor failed: %r\n" % (e,))


reaper = _Reaper()
os.register_at_fork(after_in_child=reaper.after_fork_in_child)


def release_later(ep, block_id, rl):
    """Queues the release of a dead handle's block (after its reload in flight, if any)."""
    reaper.put(lambda: _release(ep, block_id, rl))


def _release(ep, block_id, rl):
    """Frees a dead handle's block (after its reload in flight, if any) and reload slot. A
    handle inherited through fork belongs to the parent's session: the child leaves it alone."""
    if getattr(ep, "pid", None) != os.getpid():
        return
    if rl is not None:
        ep.transport.abandon_reload(rl)
        if rl.sent:  # a reload with release_after frees the block itself when it succeeds
            after = rl.release_after
            rl.done.add_done_callback(
                lambda f: None if after and f.exception() is None else ep.client.release(block_id))
            return
    ep.client.release(block_id)
