"""Detects the CUDA toolkit (default /usr/local/cuda, or $CUDA_PATH).

Generates @local_cuda with:
  //:cudart      cc_library with the toolkit's headers, libcudart and an rpath (empty when absent)
  //:cusolver    cc_library for cuSOLVER + cuBLAS (empty when absent)
  //:nvcc        the nvcc binary (filegroup; empty when absent)
  //:defs.bzl    HAS_CUDA = True/False, for select-free gating in BUILD files
A machine without the toolkit still builds everything but the CUDA backend.
"""

def _cuda_configure_impl(ctx):
    path = ctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    has = ctx.path(path + "/include/cuda_runtime.h").exists and ctx.path(path + "/bin/nvcc").exists
    if has:
        ctx.symlink(path + "/include", "include")
        ctx.symlink(path + "/lib64", "lib64")
        ctx.symlink(path + "/bin", "bin")
        ctx.file("defs.bzl", "HAS_CUDA = True\nCUDA_PATH = \"%s\"\n" % path)
        ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])
cc_library(
    name = "headers",
    hdrs = glob(["include/**"]),
    includes = ["include"],
)
cc_library(
    name = "cudart",
    deps = [":headers"],
    linkopts = ["-L{p}/lib64", "-Wl,-rpath,{p}/lib64", "-lcudart", "-ldl", "-lpthread", "-lrt"],
)
cc_library(
    name = "cusolver",
    deps = [":cudart"],
    linkopts = ["-L{p}/lib64", "-lcusolver", "-lcublas"],
)
filegroup(name = "nvcc", srcs = ["bin/nvcc"])
""".format(p = path))
    else:
        ctx.file("defs.bzl", "HAS_CUDA = False\nCUDA_PATH = \"\"\n")
        ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])
cc_library(name = "headers")
cc_library(name = "cudart")
cc_library(name = "cusolver")
filegroup(name = "nvcc", srcs = [])
""")

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_PATH"],
    local = True,
)
