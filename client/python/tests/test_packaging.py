"""The package as Python users install it: a wheel built from client/python carries the
generated protocol stubs, the torch and transformers integrations, and declares grpcio and
protobuf (the versions the stubs check at import) as dependencies."""

import os
import subprocess
import sys
import tempfile
import unittest
import zipfile

from daemon_fixture import PY_ROOT


class WheelTest(unittest.TestCase):
    def test_wheel_has_stubs_and_dependencies(self):
        with tempfile.TemporaryDirectory() as out:
            r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                                "--no-build-isolation", "-w", out, PY_ROOT],
                               capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stderr[-3000:])
            (wheel,) = [f for f in os.listdir(out) if f.endswith(".whl")]
            with zipfile.ZipFile(os.path.join(out, wheel)) as z:
                names = set(z.namelist())
                meta = z.read(next(n for n in names if n.endswith("/METADATA"))).decode()
        for module in ("offloadd/v1/offload_pb2.py", "offloadd/v1/offload_pb2_grpc.py",
                       "offloadd/v1/projector_pb2.py", "offloadd/v1/projector_pb2_grpc.py",
                       "offloadd/torch/_store.py", "offloadd/transformers.py",
                       "offloadd/galore.py", "offloadd/_galore_optim.py",
                       "offloadd/deepspeed.py"):
            self.assertIn(module, names)
        requires = [ln.split(":", 1)[1].strip() for ln in meta.splitlines()
                    if ln.startswith("Requires-Dist:")]
        self.assertIn("grpcio>=1.85.1", requires)
        self.assertIn("protobuf<8,>=7.35.1", requires)
        self.assertIn('torch>=2.4; extra == "torch"', requires)
        self.assertIn('transformers>=5.17; extra == "transformers"', requires)
        self.assertIn('accelerate>=1.1.0; extra == "transformers"', requires)
        self.assertIn('galore-torch==1.0; extra == "galore"', requires)
        self.assertIn('bitsandbytes==0.50.2; extra == "galore"', requires)
        self.assertIn('deepspeed==0.19.8; extra == "deepspeed"', requires)


if __name__ == "__main__":
    unittest.main()
