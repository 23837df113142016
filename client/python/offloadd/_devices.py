"""The kinds of device whose tensors offloadd's torch layer moves, and what each needs.

A saved tensor's device is named by a *device key* (one daemon session per process, daemon
socket and key: offloadd.torch._endpoint): ``"<kind>:<ordinal>"`` for a device a registered
:class:`DeviceKind` claims, else the torch device type (``"cpu"``), which only a daemon on the
shm backend takes. A kind says which tensors are its own (:meth:`DeviceKind.key`), which device
id the session's Hello carries and which device object the CUDA transport drives
(:meth:`DeviceKind.open`), and whether a CUDA caching allocator's settings matter now
(:meth:`DeviceKind.uses_cuda_allocator`).

Registered here: ``cuda`` (torch CUDA tensors; offloadd.cuda). Other kinds register themselves
when their module is imported (the simulated GPU of offloadd.testing.sim_gpu claims CPU tensors
while one is active). Nothing here imports torch or a CUDA library until a kind is asked.

Thread-safety: :func:`register` may run on any thread; lookups read an immutable snapshot.
"""

import abc
import threading
from typing import Any, Callable, Dict, Optional, Tuple

# torch device type -> the kinds that may claim its tensors, asked in registration order.
_by_type: Dict[str, Tuple["DeviceKind", ...]] = {}
# kind name (the key's prefix) -> kind.
_by_name: Dict[str, "DeviceKind"] = {}
_lock = threading.Lock()


class DeviceKind(abc.ABC):
    """One kind of device. Subclasses set ``name`` (the device key's prefix, no colon) and
    ``torch_type`` (the torch device type of the tensors it may claim) and implement the
    abstract methods below (a subclass missing one cannot be instantiated: TypeError)."""

    name: str = ""
    torch_type: str = ""

    @abc.abstractmethod
    def key(self, device: Any) -> Optional[str]:
        """``"<name>:<ordinal>"`` when a tensor on torch device ``device`` (of type
        ``torch_type``) belongs to this kind now, else None (the next kind is asked)."""

    @abc.abstractmethod
    def open(self, ordinal: int) -> Tuple[str, Optional[Callable[[], Any]]]:
        """For a new daemon session of device ``ordinal``: (the device id its Hello carries --
        a GPU UUID where one can be read, else the key -- and a function making the device
        object a CudaIpcTransport drives on a cuda-backend daemon, or None when this kind has
        none). Must not raise for a device the daemon can still serve over shm; the function it
        returns may raise (then the session falls back)."""

    def uses_cuda_allocator(self) -> bool:
        """True when tensors of this kind come from a CUDA caching allocator (real or
        simulated) now, so offloadd.torch.enable() checks its settings first."""
        return False


def register(kind: DeviceKind) -> DeviceKind:
    """Adds ``kind`` (or replaces the kind of the same name) and returns it. Raises ValueError
    when its name is empty or has a colon."""
    if not kind.name or ":" in kind.name or not kind.torch_type:
        raise ValueError("a DeviceKind needs a name without ':' and a torch_type, not %r/%r"
                         % (kind.name, kind.torch_type))
    global _by_type
    with _lock:
        old = _by_name.get(kind.name)
        _by_name[kind.name] = kind
        by_type = {t: tuple(k for k in ks if k is not old) for t, ks in _by_type.items()}
        by_type[kind.torch_type] = by_type.get(kind.torch_type, ()) + (kind,)
        _by_type = by_type
    return kind


def device_key(device: Any) -> str:
    """The key of torch device ``device``: the first registered kind's claim, else
    ``device.type`` (e.g. "cpu")."""
    for kind in _by_type.get(device.type, ()):
        key = kind.key(device)
        if key is not None:
            return key
    return device.type


def kind_of(key: str) -> Tuple[Optional[DeviceKind], int]:
    """(the kind that made ``key``, its ordinal), or (None, 0) for a plain device type."""
    name, sep, ordinal = key.partition(":")
    kind = _by_name.get(name) if sep else None
    return (kind, int(ordinal)) if kind is not None else (None, 0)


def uses_cuda_allocator() -> bool:
    """True when some registered kind's tensors come from a CUDA caching allocator now."""
    return any(kind.uses_cuda_allocator() for kind in list(_by_name.values()))


class CudaKind(DeviceKind):
    """torch CUDA tensors: "cuda:<ordinal>" (the current device for an index-less device); the
    Hello carries the GPU's UUID (offloadd.cuda.CudaRuntime) or, when the driver cannot be
    asked, the key."""

    name = "cuda"
    torch_type = "cuda"

    def key(self, device: Any) -> Optional[str]:
        index = device.index
        if index is None:
            import torch
            index = torch.cuda.current_device()
        return "cuda:%d" % index

    def open(self, ordinal: int) -> Tuple[str, Optional[Callable[[], Any]]]:
        from . import cuda
        try:
            runtime = cuda.CudaRuntime()
            device_id = runtime.device_uuid(ordinal)
        except Exception:
            runtime, device_id = None, "cuda:%d" % ordinal
        return device_id, lambda: cuda.TorchCudaDevice(runtime)

    def uses_cuda_allocator(self) -> bool:
        import torch
        return torch.cuda.is_available()


register(CudaKind())
