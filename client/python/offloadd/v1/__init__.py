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

from . import offload_pb2  # noqa: E402
from . import offload_pb2_grpc  # noqa: E402

__all__ = ["offload_pb2", "offload_pb2_grpc"]
