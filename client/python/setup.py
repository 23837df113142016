"""Build hook of the offloadd package (metadata lives in pyproject.toml).

build_py first regenerates the protocol stubs offloadd/v1/offload_pb2*.py with gen_proto.sh when
the repository's proto/ directory is next to this package (an in-tree build), so an installed
package always carries stubs that match the proto it was built from. Outside the repository the
stubs must already be present.
"""

import os
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


class BuildPyWithStubs(build_py):
    def run(self):
        script = os.path.join(HERE, "gen_proto.sh")
        proto = os.path.join(HERE, "..", "..", "proto", "offload.proto")
        stub = os.path.join(HERE, "offloadd", "v1", "offload_pb2.py")
        if os.path.exists(script) and os.path.exists(proto):
            env = dict(os.environ, PYTHON=os.environ.get("PYTHON", sys.executable))
            subprocess.check_call(["sh", script], env=env)
        elif not os.path.exists(stub):
            raise RuntimeError("offloadd: %s is missing and proto/offload.proto is not next to "
                               "this package: build from the offloadd repository" % stub)
        super().run()


setup(cmdclass={"build_py": BuildPyWithStubs})
