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
        return CODE_NAMES.get(self.code, str(self.code))


class DaemonUnavailable(OffloaddError):
    """No daemon at the socket, or the session stream ended (daemon stopped or restarted).

    Blocks and regions of the session are gone with the stream; a new Client starts over.
    """

    def __init__(self, message):
        super().__init__(UNAVAILABLE, message)


class CudaExportError(RuntimeError):
    """A CUDA allocation or event could not be exported through the CUDA runtime (offloadd.cuda).

    Raised for memory without a legacy IPC handle (PyTorch ``expandable_segments:True`` / VMM),
    a missing CUDA runtime library, or a failing CUDA call; the message names the call and the fix.
    """
