"""offloadd's figures in the Transformers Trainer's logs (``offloadd.transformers.enable()``).

:class:`OffloaddLogCallback` is a ``transformers.TrainerCallback``. At each training log (a
``logs`` dict holding the training ``loss``) it adds what offloadd did since the previous one,
so the figures reach every reporting integration (TensorBoard, W&B, ...) next to the loss, the
printed log lines and ``trainer.state.log_history``:

  offloadd/offloaded            saved tensors the daemon took (count)
  offloadd/offloaded_gib        their size, GiB (2**30 bytes)
  offloadd/reloads_in_time      reloads that were complete when backward asked (count)
  offloadd/reloads_waited       reloads backward had to wait for (count)
  offloadd/host_wait_seconds    seconds the training thread blocked on offloadd
  offloadd/fallbacks            saved tensors kept in process (daemon unreachable or refusing)

and, while ``offloadd.galore.enable()`` routes GaLore projectors (the process's
``routing.stats``, offloadd.galore.ProjectorStats):

  offloadd/galore_refreshes_computed      adopted refreshes the daemon computed for this process
  offloadd/galore_refreshes_deduplicated  adopted refreshes it took from another rank's identical
                                          one (no SVD ran for this process)
  offloadd/galore_kept_stale              asynchronous refreshes that failed: the projector in
                                          use stayed (one per parameter and refresh)
  offloadd/galore_local_fallbacks         refreshes computed in process (no daemon answered)

The offload figures are those of the process's shared context (offloadd.torch.default_context(),
which offloadd.torch.save_on_cpu, Transformers' offload and torch's offload entry points use
once enabled). At the end of training it writes one line to stderr (on the local main process):
"offloadd: training summary: ..." with the totals since training began, ending in a warning
when no saved tensor reached offloadd's hooks (activation checkpointing with offload not on).
"""

import sys

import transformers

PREFIX = "offloadd/"
_GIB = float(1 << 30)
_OFFLOAD = (("offloaded", "offloaded"), ("reloads_in_time", "prefetched_in_time"),
            ("reloads_waited", "waited"), ("host_wait_seconds", "host_wait_seconds"),
            ("fallbacks", "fallbacks"))
# Every saved tensor the context's hooks see counts in exactly one of these: all zero over a
# training run means offload was never requested (no checkpointing with offload turned on).
_PACKED = ("offloaded", "kept", "fallbacks", "skipped_small", "skipped_params", "skipped_leaves",
           "skipped_views", "skipped_other")
NOT_REQUESTED = ("offloadd saw no saved tensor during training, so nothing was offloaded: turn on "
                 "activation checkpointing with offload (TrainingArguments("
                 "activation_checkpointing=True, activation_checkpointing_kwargs={\"offload\": "
                 "True}), or model.activation_checkpointing_enable(offload=True); "
                 "gradient_checkpointing_enable in Transformers releases without it)")
_GALORE = (("galore_refreshes_computed", "computed"),
           ("galore_refreshes_deduplicated", "deduplicated"),
           ("galore_kept_stale", "kept_stale"), ("galore_local_fallbacks", "local_fallbacks"))


def _offload_counts():
    """The shared context's counts: {stats field: value}; and the context itself."""
    import offloadd.torch as ot
    ctx = ot.default_context()
    d = ctx.stats.as_dict()
    fields = set(f for _, f in _OFFLOAD) | set(_PACKED) | {"offloaded_bytes"}
    return ctx, {f: d[f] for f in fields}


def _galore_counts():
    """The GaLore routing's counts ({} while offloadd.galore is not enabled)."""
    routing = sys.modules.get("offloadd.galore._optim")
    routing = routing.active() if routing is not None else None
    if routing is None:
        return {}
    d = routing.stats.as_dict()
    return {f: d[f] for _, f in _GALORE}


def _delta(now, then):
    """now - then per field; ``then`` counts as zero when a count went down (reset)."""
    if any(now[k] < then.get(k, 0) for k in now):
        then = {}
    return {k: now[k] - then.get(k, 0) for k in now}


class OffloaddLogCallback(transformers.TrainerCallback):
    """Adds offloadd's figures to each training log and prints a summary line at the end."""

    def __init__(self):
        self._ctx = None
        self._last = {}      # counts at the previous training log
        self._begin = {}     # counts when training began
        self._galore_last, self._galore_begin = {}, {}

    def _counts(self):
        ctx, counts = _offload_counts()
        if ctx is not self._ctx:   # enable() with new arguments: a new context, from zero
            self._ctx, self._last, self._begin = ctx, {}, {}
        return counts

    def on_train_begin(self, args, state, control, **kwargs):
        self._last = self._begin = self._counts()
        self._galore_last = self._galore_begin = _galore_counts()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs:
            return
        counts, galore = self._counts(), _galore_counts()
        figures = self.figures(_delta(counts, self._last), _delta(galore, self._galore_last))
        self._last, self._galore_last = counts, galore
        logs.update(figures)
        # Trainer.log appended a copy of ``logs`` to log_history before calling on_log.
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(figures)

    @staticmethod
    def figures(delta, galore_delta):
        """The log entries for counts ``delta`` (and ``galore_delta``, possibly empty)."""
        out = {PREFIX + key: delta[field] for key, field in _OFFLOAD}
        out[PREFIX + "offloaded_gib"] = delta["offloaded_bytes"] / _GIB
        out[PREFIX + "host_wait_seconds"] = float(delta["host_wait_seconds"])
        for key, field in _GALORE:
            if field in galore_delta:
                out[PREFIX + key] = galore_delta[field]
        return out

    def on_train_end(self, args, state, control, **kwargs):
        total = _delta(self._counts(), self._begin)
        galore = _delta(_galore_counts(), self._galore_begin)
        if state.is_local_process_zero:
            sys.stderr.write(summary(total, galore) + "\n")


def summary(total, galore):
    """"offloadd: training summary: ..." for totals ``total`` (offloadd.torch stats fields) and
    ``galore`` (ProjectorStats fields; {} without GaLore routing). When the hooks saw no saved
    tensor at all (every field of _PACKED zero: offload never requested), the line ends with
    the warning NOT_REQUESTED."""
    line = ("offloadd: training summary: offloaded %d tensors (%.3f GiB), reloaded %d (%d in "
            "time, %d waited), host waits %.3f s, fallbacks %d"
            % (total["offloaded"], total["offloaded_bytes"] / _GIB,
               total["prefetched_in_time"] + total["waited"], total["prefetched_in_time"],
               total["waited"], total["host_wait_seconds"], total["fallbacks"]))
    if galore:
        line += ("; GaLore refreshes: %d computed by the daemon, %d deduplicated, %d kept stale, "
                 "%d local fallbacks" % (galore["computed"], galore["deduplicated"],
                                         galore["kept_stale"], galore["local_fallbacks"]))
    if not any(total.get(f, 0) for f in _PACKED):
        line += ". Warning: " + NOT_REQUESTED
    return line


def install(on=True):
    """Adds the callback to every Trainer made from now on (transformers.trainer's default
    callbacks), or removes it (``on=False``)."""
    import transformers.trainer as tt
    present = OffloaddLogCallback in tt.DEFAULT_CALLBACKS
    if on and not present:
        tt.DEFAULT_CALLBACKS.append(OffloaddLogCallback)
    elif not on and present:
        tt.DEFAULT_CALLBACKS.remove(OffloaddLogCallback)


def installed():
    """True while every new Trainer gets the callback."""
    import transformers.trainer as tt
    return OffloaddLogCallback in tt.DEFAULT_CALLBACKS
