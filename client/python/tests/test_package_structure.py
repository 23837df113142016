"""The Python package's structure: the simulated GPU stays out of the production modules (they ask
the device registry, offloadd._devices); no two modules import each other, directly or round a
longer loop, at the top or inside functions; every module imports by itself.

No daemon needed; each import check runs in a separate process with no offloadd module loaded
(forked from one that imported only the third-party packages), so modules other tests imported
do not hide what a module imports by itself."""

import ast
import inspect
import json
import os
import subprocess
import sys
import textwrap
import unittest

from daemon_fixture import PY_ROOT

import torch

from offloadd import _devices

PACKAGE = os.path.join(PY_ROOT, "offloadd")
# Where the simulator lives, and the alias module that keeps its former name importable.
TESTING_FILES = ("testing/", "sim_gpu.py")


def package_files():
    """Every module file of offloadd (relative paths), generated stubs left out."""
    out = []
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py") and not name.endswith(("_pb2.py", "_pb2_grpc.py")):
                out.append(os.path.relpath(os.path.join(folder, name), PACKAGE))
    return sorted(out)


def production_files():
    return [f for f in package_files() if not f.startswith(TESTING_FILES)]


def run_python(code):
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, cwd=PY_ROOT,
                       env=dict(os.environ, PYTHONPATH=PY_ROOT + os.pathsep +
                                os.environ.get("PYTHONPATH", "")))
    return r


class SimulatorOutOfProductionTest(unittest.TestCase):
    def test_production_modules_neither_import_nor_name_the_simulator(self):
        offenders = []
        for rel in production_files():
            with open(os.path.join(PACKAGE, rel)) as f:
                tree = ast.parse(f.read(), rel)
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom):
                    names = [node.module or ""] + [a.name for a in node.names]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                        node.value.startswith("sim:"):
                    names = [node.value]
                else:
                    continue
                if any("sim_gpu" in n or n.startswith("sim:") or n.endswith(".testing")
                       or n == "testing" for n in names):
                    offenders.append("%s:%d %s" % (rel, node.lineno, names))
        self.assertGreater(len(production_files()), 20)
        self.assertEqual(offenders, [])

    def test_cpu_tensor_key_does_not_load_the_simulator(self):
        r = run_python(
            "import sys, torch\n"
            "from offloadd.torch import _endpoint\n"
            "print(_endpoint.device_key(torch.device('cpu')))\n"
            "print(sorted(m for m in sys.modules if 'sim_gpu' in m or 'testing' in m"
            " and m.startswith('offloadd')))\n")
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        self.assertEqual(r.stdout.split("\n")[:2], ["cpu", "[]"])

    def test_simulator_registers_its_kind_and_alias_is_the_same_module(self):
        r = run_python(
            "import torch\n"
            "from offloadd import _devices\n"
            "from offloadd.testing import sim_gpu\n"
            "from offloadd import sim_gpu as alias\n"
            "import offloadd.sim_gpu as alias2\n"
            "print(alias is sim_gpu, alias2 is sim_gpu)\n"
            "cpu = torch.device('cpu')\n"
            "print(_devices.device_key(cpu), _devices.uses_cuda_allocator())\n"
            "gpu = sim_gpu.SimGpu(devices=2, device_bytes=4 << 20)\n"
            "sim_gpu.activate(gpu)\n"
            "sim_gpu.set_device(1)\n"
            "kind, ordinal = _devices.kind_of(_devices.device_key(cpu))\n"
            "device_id, make = kind.open(ordinal)\n"
            "print(_devices.device_key(cpu), kind.name, ordinal,"
            " device_id == sim_gpu.device_uuid(1), type(make()).__name__,"
            " _devices.uses_cuda_allocator())\n"
            "sim_gpu.activate(None)\n"
            "gpu.close()\n"
            "print(_devices.device_key(cpu))\n")
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        cuda = str(torch.cuda.is_available())
        self.assertEqual(r.stdout.split("\n")[:4],
                         ["True True", "cpu " + cuda,
                          "sim:1 sim 1 True SimCudaDevice True", "cpu"])


def module_name(rel):
    """offloadd/torch/_store.py -> "offloadd.torch._store"; a package's __init__.py -> its name."""
    parts = ["offloadd"] + rel[:-3].split(os.sep)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph():
    """{module: {modules of offloadd it names in an import statement anywhere in its file}}:
    ``from . import x`` and ``from .x import y`` (x or x.y where that is a module), ``import
    offloadd.x``, ``from offloadd.x import y``; top-level and inside functions alike."""
    files = package_files()
    modules = {module_name(f): f for f in files}
    graph = {}
    for name, rel in modules.items():
        package = name if rel.endswith("__init__.py") else name.rpartition(".")[0]
        with open(os.path.join(PACKAGE, rel)) as f:
            tree = ast.parse(f.read(), rel)
        edges = set()
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - (node.level - 1)]
                    base = ".".join(base + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets = [base + "." + a.name for a in node.names] + [base]
            for t in targets:
                if t in modules and t != name:
                    edges.add(t)
                    break  # the most specific module the statement names
        graph[name] = edges
    return graph


def cycles(graph):
    """Every import cycle (as a list of modules, first repeated last), each found once."""
    found, state, stack = [], {}, []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                found.append(stack[stack.index(n):] + [n])
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return found


def _is_sys_modules(node):
    return isinstance(node, ast.Attribute) and node.attr == "modules" and \
        isinstance(node.value, ast.Name) and node.value.id == "sys"


def sys_modules_lookups():
    """(file:line, name) of every string constant the package looks up in sys.modules
    (``sys.modules.get(name)``, ``sys.modules[name]``, ``name in sys.modules``)."""
    out = []
    for rel in package_files():
        with open(os.path.join(PACKAGE, rel)) as f:
            tree = ast.parse(f.read(), rel)
        for node in ast.walk(tree):
            key = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr == "get" and _is_sys_modules(node.func.value) and node.args:
                key = node.args[0]
            elif isinstance(node, ast.Subscript) and _is_sys_modules(node.value):
                key = node.slice
            elif isinstance(node, ast.Compare) and any(_is_sys_modules(c)
                                                       for c in node.comparators):
                key = node.left
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                out.append(("%s:%d" % (rel, node.lineno), key.value))
    return out


class ImportCycleTest(unittest.TestCase):
    def test_graph_sees_the_package_imports(self):
        graph = import_graph()
        self.assertIn("offloadd.torch._store", graph)
        self.assertIn("offloadd.torch._endpoint", graph["offloadd.torch._store"])
        self.assertIn("offloadd.errors", graph["offloadd.torch._endpoint"])
        self.assertIn("offloadd.galore._optim", graph["offloadd.galore"])
        self.assertEqual(cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}), [["a", "b", "c", "a"]])
        self.assertEqual(cycles({"a": {"b"}, "b": set()}), [])

    def test_modules_looked_up_by_name_exist(self):
        """A module found through sys.modules by its name (to read it only when something else
        imported it) escapes the import graph: the name must still be a module of the
        package."""
        lookups = [(where, name) for where, name in sys_modules_lookups()
                   if name.startswith("offloadd")]
        self.assertGreaterEqual(len(lookups), 2)
        modules = set(import_graph())
        self.assertEqual([(w, n) for w, n in lookups if n not in modules], [])

    def test_no_import_cycle(self):
        self.assertEqual(cycles(import_graph()), [])

    def test_every_module_imports_by_itself(self):
        """Each module imported with no other offloadd module loaded (modules whose optional
        third-party dependency is not installed are skipped, by the missing name). One child
        interpreter imports the third-party packages once and forks a process per module, so
        every module starts from an empty offloadd namespace without paying torch's import
        each time."""
        script = textwrap.dedent("""
            import importlib, json, os, sys
            for dep in ("torch", "grpc", "google.protobuf", "numpy", "transformers"):
                try:
                    importlib.import_module(dep)
                except ImportError:
                    pass
            assert not [m for m in sys.modules if m.startswith("offloadd")]
            results = {}
            for name in json.loads(sys.argv[1]):
                r, w = os.pipe()
                pid = os.fork()
                if pid == 0:
                    os.close(r)
                    try:
                        importlib.import_module(name)
                        msg = "OK"
                    except ModuleNotFoundError as e:
                        msg = ("FAIL " if (e.name or "").startswith("offloadd") else "SKIP ") + \
                            repr(e)
                    except BaseException as e:
                        msg = "FAIL " + repr(e)
                    os.write(w, msg.encode()[:4000])
                    os._exit(0)
                os.close(w)
                with os.fdopen(r) as f:
                    results[name] = f.read()
                os.waitpid(pid, 0)
            print(json.dumps(results))
            """)
        names = sorted(import_graph())
        out = subprocess.run(
            [sys.executable, "-c", script, json.dumps(names)], capture_output=True, text=True,
            cwd=PY_ROOT, timeout=300,
            env=dict(os.environ, PYTHONPATH=PY_ROOT + os.pathsep +
                     os.environ.get("PYTHONPATH", "")))
        self.assertEqual(out.returncode, 0, out.stderr[-2000:])
        results = json.loads(out.stdout.strip().splitlines()[-1])
        self.assertEqual(sorted(results), names)
        failed = {n: r for n, r in results.items() if r.startswith("FAIL") or not r}
        skipped = [n for n, r in results.items() if r.startswith("SKIP")]
        self.assertEqual(failed, {})
        self.assertLess(len(skipped), 4, skipped)


def _plain_signature(fn):
    """(name, kind, default) of every parameter: annotations aside, what a caller relies on."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


class TransportProtocolTest(unittest.TestCase):
    def test_both_transports_have_every_method_with_its_signature(self):
        from offloadd.torch import _transport
        from offloadd.torch._transport_protocol import Transport
        methods = sorted(n for n, v in vars(Transport).items()
                         if callable(v) and not n.startswith("_"))
        self.assertEqual(methods, sorted([
            "start_offload", "finish_offload", "rescue", "in_flight_tensor", "prepare_reload",
            "send_reload", "finish_reload", "release_dest", "abandon_reload", "close"]))
        for cls in (_transport.ShmTransport, _transport.CudaIpcTransport):
            for name in methods:
                with self.subTest(cls=cls.__name__, method=name):
                    self.assertTrue(callable(getattr(cls, name, None)))
                    self.assertEqual(_plain_signature(getattr(cls, name)),
                                     _plain_signature(getattr(Transport, name)))
                    self.assertTrue(getattr(Transport, name).__doc__)
            self.assertIn("device_key", vars(cls))
        self.assertEqual(sorted(Transport.__annotations__), ["client", "device_key"])

    def test_a_class_missing_a_method_is_not_a_transport(self):
        from offloadd.torch._transport_protocol import Transport

        class Partial:
            client = device_key = None

            def close(self):
                pass

        self.assertNotIsInstance(Partial(), Transport)


class StateEnumTest(unittest.TestCase):
    def test_no_state_set_is_a_bare_range(self):
        """``A, B, C = range(3)`` names states nobody can print or check: every such set is an
        IntEnum (the names stay bound to its members)."""
        found = []
        for rel in package_files():
            with open(os.path.join(PACKAGE, rel)) as f:
                tree = ast.parse(f.read(), rel)
            for node in ast.walk(tree):
                if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Tuple) and \
                        isinstance(node.value, ast.Call) and \
                        getattr(node.value.func, "id", None) == "range":
                    found.append("%s:%d" % (rel, node.lineno))
        self.assertEqual(found, [])

    def test_store_states_are_the_enum_members_with_their_old_values(self):
        from offloadd.torch import _store
        self.assertEqual([(m.name, int(m)) for m in _store.SavedState],
                         [("KEPT", 0), ("OFFLOADING", 1), ("OFFLOADED", 2), ("FALLBACK", 3),
                          ("LOST", 4)])
        for m in _store.SavedState:
            self.assertIs(getattr(_store, m.name), m)
        self.assertEqual(str(_store.LOST), "4")  # formats as the int it was

    def test_simulated_segment_states_match_the_table(self):
        from offloadd.testing import sim_gpu
        self.assertEqual([(m.name, int(m)) for m in sim_gpu.SegmentState],
                         [("FREE", 0), ("LIVE", 1), ("FREED", 2)])
        self.assertEqual((sim_gpu.SEG_FREE, sim_gpu.SEG_LIVE, sim_gpu.SEG_FREED),
                         tuple(sim_gpu.SegmentState))
        self.assertIs(sim_gpu.SEG_FREED, sim_gpu.SegmentState.FREED)


def _public_callables():
    """(qualified name, function) of every public function and public method of the public
    classes that offloadd.torch, offloadd.transformers and offloadd.galore export."""
    import offloadd.galore
    import offloadd.torch
    import offloadd.transformers
    out = []
    for module in (offloadd.torch, offloadd.transformers, offloadd.galore):
        names = getattr(module, "__all__", None) or [
            n for n, v in vars(module).items()
            if not n.startswith("_") and callable(v) and
            getattr(v, "__module__", "").startswith(module.__name__)]
        for name in names:
            value = getattr(module, name)
            where = "%s.%s" % (module.__name__, name)
            if inspect.isclass(value):
                for attr, member in vars(value).items():
                    if attr.startswith("_") and attr != "__init__":
                        continue
                    if isinstance(member, (staticmethod, classmethod)):
                        member = member.__func__
                    if isinstance(member, property):
                        member = member.fget
                    if inspect.isfunction(member):
                        out.append(("%s.%s" % (where, attr), member))
            elif inspect.isfunction(value):
                out.append((where, value))
    return out


class PublicSignatureTest(unittest.TestCase):
    def test_public_functions_are_annotated(self):
        found = _public_callables()
        names = {n for n, _ in found}
        for expected in ("offloadd.torch.offload_checkpoints.__init__",
                         "offloadd.torch.synchronize", "offloadd.torch.OffloadStats.summary",
                         "offloadd.transformers.enable", "offloadd.galore.enable",
                         "offloadd.galore.ServiceProjector.project"):
            self.assertIn(expected, names)
        missing = []
        for name, fn in found:
            sig = inspect.signature(fn)
            if sig.return_annotation is inspect.Signature.empty:
                missing.append(name + " -> ?")
            for p in sig.parameters.values():
                if p.name not in ("self", "cls") and p.annotation is inspect.Parameter.empty:
                    missing.append("%s(%s)" % (name, p.name))
        self.assertEqual(missing, [])

    def test_no_private_argument_in_a_public_signature_but_keyword_only(self):
        leaks = []
        for name, fn in _public_callables():
            for p in inspect.signature(fn).parameters.values():
                if p.name.startswith("_") and p.kind is not inspect.Parameter.KEYWORD_ONLY:
                    leaks.append("%s(%s)" % (name, p.name))
        self.assertEqual(leaks, [])


class DeviceRegistryTest(unittest.TestCase):
    class _Fake(_devices.DeviceKind):
        name, torch_type = "fake", "meta"

        def __init__(self):
            self.claim = True

        def key(self, device):
            return "fake:3" if self.claim else None

        def open(self, ordinal):
            return "FAKE-%d" % ordinal, None

    def test_a_kind_without_key_and_open_cannot_be_made(self):
        class Partial(_devices.DeviceKind):
            name, torch_type = "partial", "meta"

            def key(self, device):
                return None

        with self.assertRaises(TypeError):
            Partial()  # open() is abstract

    def test_a_registered_kind_claims_its_tensors_until_it_declines(self):
        meta = torch.device("meta")
        self.assertEqual(_devices.device_key(meta), "meta")
        fake = _devices.register(self._Fake())
        try:
            self.assertEqual(_devices.device_key(meta), "fake:3")
            self.assertEqual(_devices.kind_of("fake:3"), (fake, 3))
            self.assertEqual(fake.open(3), ("FAKE-3", None))
            fake.claim = False
            self.assertEqual(_devices.device_key(meta), "meta")
        finally:
            with _devices._lock:
                _devices._by_name.pop("fake")
                _devices._by_type.pop("meta")
        self.assertEqual(_devices.kind_of("meta"), (None, 0))
        self.assertEqual(_devices.kind_of("cpu"), (None, 0))
        self.assertEqual(_devices.device_key(torch.device("cuda", 2)), "cuda:2")
        self.assertEqual(_devices.kind_of("cuda:2")[1], 2)

    def test_a_kind_needs_a_plain_name(self):
        bad = self._Fake()
        bad.name = "a:b"
        with self.assertRaisesRegex(ValueError, "without ':'"):
            _devices.register(bad)


if __name__ == "__main__":
    unittest.main()
