"""Exceptions of the offloadd client.

Every error the daemon returns arrives as ``Error{code, message}`` with a gRPC status code
(proto/offload.proto); it is raised here as :class:`OffloaddError` with ``code`` a
``grpc.StatusCode``-compatible integer and the daemon's sentence as the message.
"""

# grpc status code numbers (google.rpc.Code), named as in grpc.StatusCode.
OK = 0
CANCELLED = 1
UNKNOWN = 2
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
NOT_FOUND = 5
PERMISSION_DENIED = 7
RESOURCE_EXHAUSTED = 8
FAILED_PRECONDITION = 9
OUT_OF_RANGE = 11
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14
DATA_LOSS = 15

CODE_NAMES = {
    OK: "OK", CANCELLED: "CANCELLED", 2: "UNKNOWN", INVALID_ARGUMENT: "INVALID_ARGUMENT",
    DEADLINE_EXCEEDED: "DEADLINE_EXCEEDED", NOT_FOUND: "NOT_FOUND", 6: "ALREADY_EXISTS",
    PERMISSION_DENIED: "PERMISSION_DENIED", RESOURCE_EXHAUSTED: "RESOURCE_EXHAUSTED",
    FAILED_PRECONDITION: "FAILED_PRECONDITION", 10: "ABORTED", OUT_OF_RANGE: "OUT_OF_RANGE",
    UNIMPLEMENTED: "UNIMPLEMENTED", INTERNAL: "INTERNAL", UNAVAILABLE: "UNAVAILABLE",
    DATA_LOSS: "DATA_LOSS", 16: "UNAUTHENTICATED",
}


class OffloaddError(RuntimeError):
    """A request failed. ``code``: int gRPC status code; ``message``: what to do."""

    def __init__(self, code, message):
        self.code = int(code)
        self.message = message
        super().__init__("%s: %s" % (CODE_NAMES.get(self.code, str(self.code)), message))

    @property
    def code_name(self):
        """The status code's name ("RESOURCE_EXHAUSTED"), or its number as a str when it is
        not a google.rpc.Code this module names."""
        return CODE_NAMES.get(self.code, str(self.code))

    def fresh(self):
        """A new exception of the same class, code and message, with no traceback, cause or
        context. The client hands each waiter its own copy of a failure it stores (a dead
        session's, say): an exception object raised in several places collects every raiser's
        frames in its traceback, and those frames keep a training step's tensors alive."""
        e = type(self).__new__(type(self))
        OffloaddError.__init__(e, self.code, self.message)
        return e


class DaemonUnavailable(OffloaddError):
    """No daemon at the socket, or the session stream ended (daemon stopped or restarted).

    Blocks and regions of the session are gone with the stream; a new Client starts over.
    """

    def __init__(self, message):
        super().__init__(UNAVAILABLE, message)


class DaemonUnresponsive(OffloaddError):
    """The daemon answered nothing for ``unresponsive_seconds`` while the caller waited.

    Not known to be lost: a frozen daemon (SIGSTOP, a debugger, a cgroup freezer, a stuck driver
    call, a page-fault storm) still holds what it held. Code DEADLINE_EXCEEDED. The torch hooks
    abandon the session after it (the daemon frees its blocks if it resumes).
    """

    def __init__(self, message):
        super().__init__(DEADLINE_EXCEEDED, message)


class SocketPermissionDenied(OffloaddError):
    """This user may not connect to the daemon's socket (PERMISSION_DENIED, raised at once).

    The message names the file that shuts the process out (the socket or a directory on the
    way), its group and mode, and how to join that group. The daemon is fine: restarting it does
    not help, and on a shared pool would cost every other job's wait.
    """

    def __init__(self, message):
        super().__init__(PERMISSION_DENIED, message)


class CudaExportError(RuntimeError):
    """A CUDA allocation or event could not be exported through the CUDA runtime (offloadd.cuda).

    Raised for memory without a legacy IPC handle (PyTorch ``expandable_segments:True`` / VMM),
    a missing CUDA runtime library, or a failing CUDA call; the message names the call and the fix.
    """


class OffloadConfigError(RuntimeError):
    """The process is configured so that offloadd cannot take its CUDA tensors at all, e.g.
    PyTorch's caching allocator set to expandable segments (``PYTORCH_CUDA_ALLOC_CONF=
    expandable_segments:True``, or switched on at run time) or to the ``cudaMallocAsync`` backend:
    that memory (CUDA VMM / memory pools) has no legacy CUDA IPC handle. Raised at ``enable()``
    and at the offload that finds it, never turned into a silent per-tensor fallback; the message
    names the setting and the remedy."""
