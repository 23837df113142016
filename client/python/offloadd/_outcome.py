"""The outcome of one request, for callers that want a Future's interface without its cost.

:class:`Outcome` is the subset of ``concurrent.futures.Future`` the client and the torch hooks
use (``done``, ``cancelled``, ``result(timeout)``, ``exception(timeout)``,
``add_done_callback``, ``set_result``, ``set_exception``) without a Condition per request: one
lock shared by every outcome, held only to hand over callbacks and the waiting Event, and an
Event made only when a thread must wait for an outcome not there yet. Callbacks run on the
thread that completes it, or at once when it is already complete; a callback's exception stays
its own (as with concurrent.futures). ``result``/``exception`` raise
``concurrent.futures.TimeoutError`` after ``timeout`` seconds (None: no limit). Subclasses whose
answers some thread must fetch (the request ring's) override ``_wait``.
"""

import concurrent.futures
import os
import threading


class Outcome:
    __slots__ = ("_done", "_value", "_exc", "_callbacks", "_event")
    _lock = threading.Lock()  # shared: held only to hand over callbacks and the event

    def __init__(self):
        self._done, self._value, self._exc = False, None, None
        self._callbacks = self._event = None

    def done(self):
        return self._done

    def cancelled(self):
        return False

    def _wait(self, timeout):
        """Returns once the outcome is in; TimeoutError after ``timeout`` seconds."""
        if self._done:
            return
        with Outcome._lock:
            if not self._done and self._event is None:
                self._event = threading.Event()
            event = self._event
        if event is not None and not event.wait(timeout) and not self._done:
            raise concurrent.futures.TimeoutError("no outcome within %s s" % timeout)

    def result(self, timeout=None):
        self._wait(timeout)
        if self._exc is not None:
            raise self._exc
        return self._value

    def exception(self, timeout=None):
        self._wait(timeout)
        return self._exc

    def add_done_callback(self, fn):
        with Outcome._lock:
            if not self._done:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                return
        fn(self)

    def _finish(self, value, exc):
        with Outcome._lock:
            if self._done:
                return
            self._value, self._exc, self._done = value, exc, True
            callbacks, self._callbacks, event = self._callbacks, None, self._event
        if event is not None:
            event.set()
        for fn in callbacks or ():
            try:
                fn(self)
            except Exception:  # as concurrent.futures does: a callback's failure stays its own
                pass

    def set_result(self, value):
        self._finish(value, None)

    def set_exception(self, exc):
        self._finish(None, exc)


def _after_fork_in_child():
    """A thread that held the shared lock at a fork does not exist in the child: the lock is
    made free there again, the same object (offloadd._store_front holds it)."""
    Outcome._lock._at_fork_reinit()


if hasattr(Outcome._lock, "_at_fork_reinit"):  # CPython >= 3.9
    os.register_at_fork(after_in_child=_after_fork_in_child)
