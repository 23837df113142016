"""Protobuf/gRPC C++ code generation with Debian's /usr/bin/protoc and grpc_cpp_plugin.

Bazel's native proto rules would need a protobuf source repository; a genrule needs nothing.
"""

def cc_grpc_proto_library(name, srcs, deps = [], grpc = True, **kwargs):
    """Generates <src>.pb.{h,cc} (and .grpc.pb.{h,cc} when grpc) and wraps them in a cc_library.

    srcs: .proto files in this package; imports are resolved from the workspace root.
    deps: other cc_grpc_proto_library targets whose protos these import.
    """
    bases = [s[:-len(".proto")] for s in srcs]
    outs = [b + ".pb.h" for b in bases] + [b + ".pb.cc" for b in bases]
    if grpc:
        outs += [b + ".grpc.pb.h" for b in bases] + [b + ".grpc.pb.cc" for b in bases]
    pkg = native.package_name()
    grpc_flags = "--plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin --grpc_out=$(GENDIR) " if grpc else ""
    native.genrule(
        name = name + "_gen",
        srcs = srcs + [d + "_srcs" for d in deps],
        outs = outs,
        cmd = "/usr/bin/protoc -I. --cpp_out=$(GENDIR) " + grpc_flags +
              " ".join([pkg + "/" + s for s in srcs]),
    )
    native.filegroup(name = name + "_srcs", srcs = srcs + [d + "_srcs" for d in deps])
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        deps = deps + ["@system//:grpc"],
        **kwargs
    )
