"""Generated protocol stubs of offloadd.v1 (proto/offload.proto).

The modules offload_pb2 and offload_pb2_grpc are produced by client/python/gen_proto.sh (protoc +
grpc_python_plugin) and are not checked in. Importing this package without them raises an
ImportError that says how to generate them.
"""

import os as _os

_HERE = _os.path.dirname(_os.path.abspath(__file__))
_MISSING = [n for n in ("offload_pb2.py", "offload_pb2_grpc.py")
            if not _os.path.exists(_os.path.join(_HERE, n))]
if _MISSING:
    raise ImportError(
        "offloadd: the generated protocol stubs (%s) are missing from %s: run "
        "client/python/gen_proto.sh (needs protobuf-compiler and protobuf-compiler-grpc), or "
        "install the package with pip, which generates them" % (", ".join(_MISSING), _HERE))

# Stubs from grpcio-tools check the protobuf runtime at import (protobuf >= 7.35.1 and < 8, the
# package's dependency); a protobuf too old to have that check fails with a bare ImportError.
_PROTOBUF_NEEDED = ">=7.35.1,<8"


def _protobuf_too_old(err):
    """An ImportError saying which protobuf this environment imports and what to install."""
    import google.protobuf as pb
    where = _os.path.dirname(getattr(pb, "__file__", None) or "?")
    debian = " (Debian's python3-protobuf, which a --system-site-packages environment sees)" \
        if where.startswith("/usr/lib/python3/") else ""
    return ImportError(
        "offloadd: its protocol stubs need protobuf %s, but this environment imports protobuf "
        "%s from %s%s: run pip install 'protobuf%s' in it (%s)" % (
            _PROTOBUF_NEEDED, getattr(pb, "__version__", "?"), where, debian, _PROTOBUF_NEEDED,
            err))


try:
    from . import offload_pb2  # noqa: E402
except ImportError as _err:
    if "runtime_version" not in str(_err):
        raise
    raise _protobuf_too_old(_err) from None
from . import offload_pb2_grpc  # noqa: E402

__all__ = ["offload_pb2", "offload_pb2_grpc"]
