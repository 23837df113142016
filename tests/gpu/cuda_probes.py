"""Probes of the Python client's CUDA path on a GPU, through a running offloadd (backend "cuda").

Run by tests/gpu/run.sh: ``python3 cuda_probes.py --socket PATH --python-root DIR --probes LIST``.
Prints "SKIPPED: ..." and exits 0 without a GPU; "PASS ..." / "FAIL: ..." per probe (exit 1 if
any failed); figures as "FIGURE <name> <value> <unit>". Probes (comma-separated ``--probes``):

  sticky       a failed export (cudaIpcGetMemHandle of pinned host memory, and with expandable
               segments on of a device tensor) must leave CUDA's last-error state clear:
               cudaPeekAtLastError() is 0 afterwards and torch's next kernel launch succeeds.
  empty_cache  device memory must come back after torch.cuda.empty_cache() once the daemon has
               copied out of and into the freed segments: cudaMemGetInfo's free bytes after a
               round in which --segments (8) products each save two 256 MiB tensors (each its
               own segment; offloaded, then reloaded by backward), freed and emptied, are within
               one segment of the free bytes before it (a daemon still mapping a freed segment
               keeps its memory allocated, CUDA IPC's documented lifetime).
               It also counts the client's per-pointer CUDA calls (cuMemGetAddressRange,
               cudaIpcGetMemHandle) per offload in that round (FIGURE python_*_calls_per_offload;
               a client that caches per allocation makes about one per allocation).
  runtime_expandable  expandable segments switched on at run time
               (torch.cuda.memory._set_allocator_settings): the next offload either reaches the
               daemon or raises one error naming the setting; a per-tensor fallback fails.

Every probe reads the client's API as it is (attributes looked up, missing ones named in the
FAIL line), so a renamed call fails with a sentence, not a traceback.
"""

import argparse
import os
import sys
import time
import traceback

MIB = 1 << 20


def say(line):
    print(line, flush=True)


def expandable_on():
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        if "expandable_segments:true" in os.environ.get(var, "").replace(" ", "").lower():
            return True
    return False


def probe_sticky(torch, sock):
    """A failed export leaves no error for torch's next launch."""
    from offloadd import cuda as oc
    from offloadd import errors
    rt = oc.CudaRuntime()
    export = getattr(rt, "ipc_mem_handle", None)
    if export is None:
        say("FAIL: offloadd.cuda.CudaRuntime has no ipc_mem_handle (renamed?): the sticky-error "
            "probe needs the client's export call")
        return False
    targets = [("pinned host memory", torch.empty(MIB, dtype=torch.uint8, pin_memory=True))]
    if expandable_on():
        targets.append(("an expandable-segments device tensor",
                        torch.empty(4 * MIB, dtype=torch.uint8, device="cuda")))
    torch.cuda.synchronize()
    ok = True
    for what, t in targets:
        try:
            export(t.data_ptr())
            say("NOTE: exporting %s succeeded (nothing to check for it)" % what)
            continue
        except (errors.CudaExportError, errors.OffloadConfigError) as e:
            reason = str(e)  # the allocator's error names the setting (expandable segments)
        peek = getattr(rt.cudart, "cudaPeekAtLastError", None)
        left = peek() if peek is not None else None
        try:
            y = torch.ones(1024, device="cuda") * 2
            torch.cuda.synchronize()
            launched = float(y.sum().item()) == 2048.0
            launch_error = None if launched else "wrong result"
        except Exception as e:  # torch's launch check raising is exactly what must not happen
            launch_error = "%s: %s" % (type(e).__name__, str(e).splitlines()[0])
        if left not in (0, None) or launch_error:
            say("FAIL: after a failed export of %s (%s) CUDA's last error is %s and torch's next "
                "kernel launch %s" % (what, reason[:120], left,
                                      "raised " + launch_error if launch_error else "succeeded"))
            ok = False
        else:
            say("PASS sticky: export of %s failed (%s...), last error %s, torch's next launch "
                "succeeded" % (what, reason[:80], "cleared" if left == 0 else "n/a"))
    return ok


def _round(torch, ot, ctx, n, mib):
    """n tensors of mib MiB, each its own segment, offloaded in forward and reloaded in backward."""
    w = torch.ones(1, device="cuda", requires_grad=True)
    before = ctx.stats.snapshot()
    with ctx:
        loss = 0
        for i in range(n):
            x = torch.full((mib * MIB // 4,), float(i + 1), device="cuda")
            loss = loss + (x * w).sin().sum()  # sin saves x * w: a fresh segment
            del x
    # The host runs ahead of the GPU: without this, backward would use the last tensors from
    # the device while their offloads still wait on their producers (served in flight), and
    # those segments would never be reloaded into. Wait (bounded) until all n are stored.
    torch.cuda.synchronize()
    end = time.monotonic() + 10.0
    while (ctx.stats.snapshot() - before).offloaded < n and time.monotonic() < end:
        time.sleep(0.005)
    loss.backward()
    ot.synchronize()
    torch.cuda.synchronize()
    return ctx.stats.snapshot() - before


def count_export_calls(names=("allocation_range", "ipc_mem_handle")):
    """Wraps the client's per-pointer CUDA calls (those present) to count them; returns the
    counter dict. The client should make them once per allocation, not per offload."""
    from offloadd import cuda as oc
    counts = {}
    for name in names:
        inner = getattr(oc.CudaRuntime, name, None)
        if inner is None:
            continue
        counts[name] = 0

        def wrapped(self, *a, _inner=inner, _name=name, **k):
            counts[_name] += 1
            return _inner(self, *a, **k)
        setattr(oc.CudaRuntime, name, wrapped)
    return counts


def probe_empty_cache(torch, sock):
    import offloadd.torch as ot
    calls = count_export_calls()
    ctx = ot.offload_checkpoints(threshold_bytes=MIB, socket_path=sock, strict=True,
                                 keep_last_n=0, name="gpu-probe empty_cache")
    _round(torch, ot, ctx, 2, 64)  # the daemon's context and first mappings exist now
    torch.cuda.empty_cache()
    time.sleep(0.5)
    free0 = torch.cuda.mem_get_info()[0]
    for k in calls:
        calls[k] = 0
    n, mib = SEGMENTS, 256
    d = _round(torch, ot, ctx, n, mib)
    reserved = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    time.sleep(1.0)  # a mapping dropped asynchronously gets a second
    free1 = torch.cuda.mem_get_info()[0]
    held = free0 - free1
    say("FIGURE empty_cache_device_bytes_not_returned %d bytes (%.0f MiB; torch reserved %.0f MiB "
        "before empty_cache, %.0f MiB after; %d tensors of %d MiB offloaded and reloaded)"
        % (held, held / MIB, reserved / MIB, torch.cuda.memory_reserved() / MIB, d.offloaded, mib))
    for name, c in sorted(calls.items()):
        say("FIGURE python_%s_calls_per_offload %.2f calls (%d for %d offloads and %d reloads; "
            "%d saved tensors and %d reload destinations, each its own allocation)"
            % (name, c / max(1, d.offloaded), c, d.offloaded, d.reloaded, d.offloaded,
               d.reloaded))
    if not calls:
        say("FIGURE python_export_calls_per_offload n/a (no per-pointer call found to count)")
    ot.close()
    if d.offloaded < n or d.fallbacks:
        say("FAIL: empty_cache probe: %d of %d tensors reached the daemon (fallbacks %d): "
            "nothing was mapped to test" % (d.offloaded, n, d.fallbacks))
        return False
    if held > mib * MIB:
        say("FAIL: %.0f MiB of device memory did not come back after empty_cache(): the daemon "
            "still maps segments the allocator freed" % (held / MIB))
        return False
    say("PASS empty_cache: device memory came back (%.0f MiB short, under one %d MiB segment)"
        % (held / MIB, mib))
    return True


def probe_runtime_expandable(torch, sock):
    import offloadd.torch as ot
    setter = getattr(getattr(torch.cuda, "memory", None), "_set_allocator_settings", None)
    if setter is None:
        say("FAIL: torch %s has no torch.cuda.memory._set_allocator_settings: switch the probe "
            "to this torch's way of changing allocator settings" % torch.__version__)
        return False
    torch.cuda.empty_cache()  # no cached block of an earlier segment serves the next tensors
    setter("expandable_segments:True")
    try:
        ctx = ot.offload_checkpoints(threshold_bytes=MIB, socket_path=sock, keep_last_n=0,
                                     name="gpu-probe runtime expandable")
        d = _round(torch, ot, ctx, 2, 64)
    except Exception as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        good = "expandable" in msg.lower()
        say(("PASS runtime_expandable: refused with one error: %s" if good else
             "FAIL: switching expandable segments on at run time raised an error that does not "
             "name the setting: %s") % msg[:200])
        return good
    finally:
        setter("expandable_segments:False")
        ot.close()
    if d.fallbacks:
        say("FAIL: with expandable segments switched on at run time %d tensors fell back "
            "in-process (a silent per-tensor fallback), %d reached the daemon"
            % (d.fallbacks, d.offloaded))
        return False
    say("PASS runtime_expandable: %d tensors reached the daemon with expandable segments on"
        % d.offloaded)
    return d.offloaded > 0


SEGMENTS = 8  # empty_cache: tensors of 256 MiB, each its own segment (--segments)

PROBES = {"sticky": probe_sticky, "empty_cache": probe_empty_cache,
          "runtime_expandable": probe_runtime_expandable}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--python-root", required=True)
    ap.add_argument("--probes", default="sticky,empty_cache,runtime_expandable")
    ap.add_argument("--segments", type=int, default=SEGMENTS,
                    help="empty_cache: 256 MiB tensors per round (the pool must hold them)")
    a = ap.parse_args()
    globals()["SEGMENTS"] = max(1, a.segments)
    sys.path.insert(0, a.python_root)
    import torch
    if not torch.cuda.is_available():
        say("SKIPPED: torch.cuda.is_available() is False (no driver or GPU)")
        return 0
    try:
        import offloadd.torch  # noqa: F401  (refuses an unsupported torch with a sentence)
    except ImportError as e:
        say("FAIL: torch %s: %s" % (torch.__version__, e))
        return 1
    say("torch %s, expandable segments %s" % (torch.__version__,
                                               "on" if expandable_on() else "off"))
    ok = True
    for name in a.probes.split(","):
        try:
            ok = PROBES[name](torch, a.socket) and ok
        except Exception as e:
            traceback.print_exc()
            say("FAIL: probe %s raised %s: %s" % (name, type(e).__name__, str(e)[:200]))
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
