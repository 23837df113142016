"""This process's id for the per-tensor path's fork checks, without a system call per check.

``os.getpid()`` is a system call on every call (glibc stopped caching it in 2.25): ~0.25 µs on
the build machine, and the hooks checked it about eight times per saved tensor. :data:`pid` is
read once at import and again in every forked child (``os.register_at_fork``, which
``os.fork`` and every C extension that forks through ``PyOS_AfterFork_Child`` run), before any
handler a module importing this one registers: those run after this one, in registration
order, so they read the child's id too.

Use ``_process.pid`` (the module attribute, read at each use), never ``from _process import
pid`` (a copy that a fork does not update).
"""

import os

pid = os.getpid()


def _after_fork_in_child():
    global pid
    pid = os.getpid()


os.register_at_fork(after_in_child=_after_fork_in_child)
