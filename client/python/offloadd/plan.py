"""Capacity planner for activation-checkpoint offload (Python twin of ``offloadctl plan``).

Same model, field names and JSON keys as the C++ planner in client/plan/planner.h; both are
tested against one set of vectors (client/plan/testdata/plan_vectors.json).

Source of every formula and figure: shared/reference/activation-checkpoint-offload.txt ("[ref]"),
section "When the copy is free: the bandwidth arithmetic" unless noted:

* checkpoint per layer = b * s * h * dtype_bytes / tp bytes ("b·s·h·2 bytes" in bf16; tp: the
  tensor-parallel degree, see ``plan``)
* checkpoint per GPU = L * (per layer); pinned host RAM per node = GPUs per node * (L -
  keep_last_n) * (per layer) ([ref] "What it costs": "L x b x s x h x 2 bytes per GPU, times the
  GPUs in a node", less what keep_last_n leaves on the GPU)
* copy per layer (each direction) = per-layer bytes / (link rate / GPUs sharing the link)
* forward per layer = (2 * b*s * params_per_layer + 2 * b * s**2 * attention_width) / tp / rate
* synchronous slowdown = 2 copies / 4 forwards per layer (forward, recompute, backward = 2)
* overlapped slowdown = max(0, copy - 3 forwards) / 4 forwards: the reload of layer k-1 hides
  behind layer k's recompute and backward, "three forwards' worth of time"

First order, as [ref] states: full link rate, no HBM contention, no embedding or loss layers, no
first-step pinning cost. Added here: GPUs sharing a link copy at once and split it evenly; in the
overlapped schedule forward never waits for an offload (Arctic's design per [ref]), so offloads
that fall behind forward stay on the GPU into backward (``offloads_in_flight_at_backward``); the
pool's allocator headroom (``pool_headroom``), the host RAM cap on the pool (``host_ram_bytes``),
tensor parallelism (``tp``), the decision (``DECISIONS``) and the settings that follow
(``enable_call``, ``format_settings``).

Units: bytes are ints; GB/s means 1e9 bytes/s ([ref]'s GBps); GiB is 2**30 bytes; seconds;
slowdowns are fractions of the checkpointed step time without offload (0.157 = 15.7%).
"""

import dataclasses
import json
import math
import warnings
from typing import Dict, List, Optional, Sequence, Tuple, Union

# Link presets in bytes/s per direction, all "reported" in [ref] (from the ml-engineering book):
# PCIe 4 x16 31 GBps; PCIe 5 x16 63 GBps; 8x H200 node measured with nvbandwidth 55.43 GBps
# host-to-device (55.06 device-to-host; [ref]'s worked figures use 55.43); NVLink-C2C 450 GBps.
LINK_PRESETS: Dict[str, float] = {
    "pcie4": 31e9,
    "pcie5": 63e9,
    "h200": 55.43e9,
    "nvlink-c2c": 450e9,
}

# GPU names standing for their host link (sources as in client/plan/planner.h):
# h100: H100 SXM5 and PCIe reach the host over PCIe Gen5 x16 (NVIDIA H100 PCIe product brief
#   PB-11133-001, "PCI Express Gen5 card"); a100: PCIe Gen4 x16 (NVIDIA A100 PCIe product brief
#   PB-10137-001, "PCI Express Gen4 card"; SXM4 32+32 GB/s Gen4); b200: the GPU has a PCIe Gen6
#   interface but DGX B200's host CPUs are "Intel Xeon 8570 PCIe Gen5 CPUs" (NVIDIA DGX B200
#   user guide), so the link runs at Gen5; gh200: NVLink-C2C, 900 GB/s both directions together.
#   h200 is the measured link preset itself.
GPU_HOST_LINKS: Dict[str, str] = {
    "h100": "pcie5",
    "a100": "pcie4",
    "b200": "pcie5",
    "gh200": "nvlink-c2c",
}

# Pool allocator headroom, as docs/overview.md "Pool" documents the extent allocator's high-water mark
# over the peak live bytes: ~1.05x for one rank; ~1.1x, worst seen 1.3x, for several ranks
# sharing the pool (the worst is used so a bad step's offloads do not wait for space).
POOL_HEADROOM_ONE_RANK = 1.05
POOL_HEADROOM_SEVERAL_RANKS = 1.3

DEFAULT_THRESHOLD_BYTES = 1 << 20  # offloadd.torch's threshold_bytes default
DEFAULT_KEEP_LAST_N = 1            # offloadd.torch's keep_last_n default

# Decisions, first match wins (same names as the C++ planner's DecisionName):
#   nothing_to_offload  keep_last_n >= layers: every checkpoint stays on the GPU
#   not_needed          the measured peak (gpu_peak) fits gpu_memory: leave offload off
#   does_not_fit        even freeing every offloaded checkpoint at the peak leaves more than
#                       gpu_memory: offload alone does not make the run fit
#   host_ram_short      the pinned host RAM per node exceeds host_ram_bytes: no pool holds the
#                       checkpoints (lower seq or batch, raise keep_last_n, or a spill tier)
#   undecided           no gpu_peak: whether offload is needed cannot be decided (the figures
#                       and settings hold if it is)
#   cannot_hide         a reload takes longer than the 3 forwards it hides behind
#   offload             offload; the overlapped copy costs nothing to first order
DECISIONS = ("nothing_to_offload", "not_needed", "does_not_fit", "host_ram_short", "undecided",
             "cannot_hide", "offload")

# [ref]: "The sustained rate is whatever your training achieves ... I use 500 below."
DEFAULT_COMPUTE_FLOPS_PER_SECOND = 500e12

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
_DTYPE_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32",
                  "float": "fp32"}

FORWARDS_TO_HIDE_RELOAD = 3.0  # [ref]: recompute + backward of the next layer
FORWARDS_PER_STEP = 4.0        # [ref]: forward, recompute, backward costing two
SYNC_COPIES_PER_LAYER = 2.0    # [ref]: offload in forward + reload in backward

NEVER_OVERLAPS = -1


@dataclasses.dataclass
class ModelShape:
    """One transformer layer as the planner sees it.

    layers: L, checkpointed layers. hidden: h, checkpoint elements per token. attention_width:
    query heads x head_dim. params_per_layer: matmul parameters of one layer (active ones for
    MoE). The remaining fields are filled only when derived from a config.json.
    """
    layers: int
    hidden: int
    attention_width: int
    params_per_layer: int
    name: str = ""
    num_attention_heads: int = 0
    num_key_value_heads: int = 0
    head_dim: int = 0
    intermediate_size: int = 0


@dataclasses.dataclass
class Plan:
    """Planner result; field names match the C++ Plan and the --json output."""
    model: ModelShape
    micro_batch: int
    seq_len: int
    dtype: str
    gpus_per_node: int
    gpus_per_link: int
    link: str
    link_bytes_per_second: float
    compute_flops_per_second: float
    checkpoint_bytes_per_element: int
    checkpoint_bytes_per_layer: int
    checkpoint_bytes_per_gpu: int
    pinned_host_bytes_per_node: int
    link_bytes_per_second_per_gpu: float
    copy_seconds_per_layer: float
    matmul_flops_per_layer: float
    attention_flops_per_layer: float
    forward_seconds_per_layer: float
    copy_to_forward_ratio: float
    sync_slowdown: float
    overlap_budget_seconds: float
    overlap_slowdown: float
    overlaps_fully: bool
    full_overlap_min_seq_len: int
    host_link: str = ""
    keep_last_n: int = DEFAULT_KEEP_LAST_N
    gpu_memory_bytes: int = 0
    gpu_peak_bytes: int = 0
    offloaded_layers: int = 0
    offloaded_bytes_per_gpu: int = 0
    offloads_in_flight_at_backward: int = 0
    gpu_bytes_freed_per_gpu: int = 0
    tensor_parallel_size: int = 1
    host_ram_bytes: int = 0
    pool_headroom: float = 0.0
    pool_bytes_with_headroom: int = 0
    pool_bytes: int = 0
    gpu_peak_with_offload_min_bytes: int = 0
    decision: str = "offload"

    def to_dict(self) -> dict:
        """The same JSON object shape as ``offloadctl plan --json``."""
        d = dataclasses.asdict(self)
        m = self.model
        d["model"] = {"name": m.name, "layers": m.layers, "hidden": m.hidden,
                      "attention_width": m.attention_width,
                      "params_per_layer": m.params_per_layer}
        d["inputs"] = {k: d.pop(k) for k in (
            "micro_batch", "seq_len", "dtype", "gpus_per_node", "gpus_per_link", "link",
            "host_link", "link_bytes_per_second", "compute_flops_per_second", "keep_last_n",
            "gpu_memory_bytes", "gpu_peak_bytes", "tensor_parallel_size", "host_ram_bytes")}
        d["enable_call"] = enable_call(self)
        return d


def host_link(name: str) -> str:
    """The link preset a resolved link name stands for: "pcie5" for "h100", the name itself for
    a link preset or "custom"."""
    return GPU_HOST_LINKS.get(name, name)


def pool_headroom(ranks_sharing_pool: int) -> float:
    """docs/overview.md "Pool": 1.05 for one rank, 1.3 (the worst seen) for several."""
    return POOL_HEADROOM_ONE_RANK if ranks_sharing_pool <= 1 else POOL_HEADROOM_SEVERAL_RANKS


def resolve_link(link: Union[str, float, int]) -> Tuple[str, float]:
    """Link preset, GPU name (its host link: GPU_HOST_LINKS) or a number of GB/s -> (name,
    bytes per second per direction); the name is lower case ("h100"; host_link() gives its
    link). Raises ValueError listing the accepted names."""
    if isinstance(link, (int, float)) and not isinstance(link, bool):
        rate, name = float(link), "custom"
    else:
        key = str(link).lower()
        key = "nvlink-c2c" if key == "c2c" else key
        if key in LINK_PRESETS or key in GPU_HOST_LINKS:
            return key, LINK_PRESETS[host_link(key)]
        try:
            rate, name = float(key), "custom"
        except ValueError:
            raise ValueError(f"unknown link {link!r}: use a link (pcie4, pcie5, h200, "
                             "nvlink-c2c), a GPU (h100, a100, b200, gh200, h200) or a positive "
                             "GB/s number") from None
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"link bandwidth must be a positive number of GB/s, got {link!r}")
    return name, rate * 1e9


def _dtype(dtype: str) -> str:
    d = _DTYPE_ALIASES.get(str(dtype).lower(), str(dtype).lower())
    if d not in DTYPE_BYTES:
        raise ValueError(f"unknown checkpoint dtype {dtype!r}: use bf16, fp16 or fp32")
    return d


def _positive_int(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return value


def dense_layer_params(hidden: int, heads: int, kv_heads: int, head_dim: int,
                       intermediate: int) -> int:
    """Matmul parameters of a dense Llama/Qwen layer, as [ref] derives Qwen3-8B's 192,937,984:
    q and o of hidden x heads*head_dim, grouped k and v of hidden x kv_heads*head_dim, SwiGLU MLP
    of three hidden x intermediate matrices. Norm weights and biases are left out."""
    return (2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
            + 3 * hidden * intermediate)


def _copy_s(m, b, s, dbytes, per_gpu_rate, tp=1):
    return b * s * m.hidden * dbytes / tp / per_gpu_rate


def _matmul_flops(m, b, s, tp):
    return 2.0 * b * s * m.params_per_layer / tp


def _attention_flops(m, b, s, tp):
    return 2.0 * b * float(s) * s * m.attention_width / tp


def _forward_s(m, b, s, rate, tp=1):
    return (_matmul_flops(m, b, s, tp) + _attention_flops(m, b, s, tp)) / rate


def _overlaps(m, b, s, dbytes, per_gpu_rate, rate, tp=1) -> bool:
    return _copy_s(m, b, s, dbytes, per_gpu_rate, tp) <= FORWARDS_TO_HIDE_RELOAD * _forward_s(
        m, b, s, rate, tp)


def _full_overlap_min_seq_len(m, b, dbytes, per_gpu_rate, rate, tp=1) -> int:
    # Per token the copy costs h*d/rate_per_gpu while the forward costs (2P + 2sw)/R, growing
    # with s ([ref]: "the ratio improves as the sequence grows"), so full overlap holds from the
    # crossover s* = (R*h*d/(3*rate_per_gpu) - 2P) / (2w) on, and there is no largest s.
    crossover = ((m.hidden * dbytes / per_gpu_rate) * rate / FORWARDS_TO_HIDE_RELOAD
                 - 2.0 * m.params_per_layer) / (2.0 * m.attention_width)
    if not crossover < 1e18:
        return NEVER_OVERLAPS
    s = 1 if crossover <= 1.0 else int(math.ceil(crossover))
    while s > 1 and _overlaps(m, b, s - 1, dbytes, per_gpu_rate, rate, tp):
        s -= 1
    while not _overlaps(m, b, s, dbytes, per_gpu_rate, rate, tp):
        s += 1
    return s


def _offloads_in_flight_at_backward(offloaded_layers: int, copy_s: float,
                                    forward_s: float) -> int:
    """Offloads still copying when forward ends. Forward never waits for an offload ([ref],
    Arctic's design): with a copy slower than a forward they queue on the link (one at a time;
    offload j is issued when layer j + keep_last_n saves its input) and their checkpoints wait
    on the GPU, "the cost shows up as memory". 0 when copy <= forward, else offloaded_layers -
    floor(offloaded_layers * forward / copy)."""
    if copy_s <= forward_s:
        return 0
    return offloaded_layers - int(math.floor(float(offloaded_layers) * forward_s / copy_s))


def _decide(offloaded_layers: int, gpu_memory_bytes: int, gpu_peak_bytes: int, peak_min: int,
            overlaps: bool, host_ram_short: bool) -> str:
    """The decision (DECISIONS), first match wins."""
    if offloaded_layers == 0:
        return "nothing_to_offload"
    if gpu_peak_bytes and gpu_peak_bytes <= gpu_memory_bytes:
        return "not_needed"
    if gpu_peak_bytes and peak_min > gpu_memory_bytes:
        return "does_not_fit"
    if host_ram_short:
        return "host_ram_short"
    if not gpu_peak_bytes:
        return "undecided"
    return "offload" if overlaps else "cannot_hide"


# Bounds plan() accepts (as client/plan/planner.h): the daemon's smallest pool (its pool_bytes
# must be at least 1 MiB); host link GB/s per direction and one GPU's sustained TFLOP/s, wider
# than any real link or GPU: outside them a figure is a typo or a unit mix-up.
MIN_POOL_BYTES = 1 << 20
MIN_LINK_GBPS, MAX_LINK_GBPS = 0.01, 10000.0
MIN_TFLOPS, MAX_TFLOPS = 0.001, 1e6


def _check_tp_and_host_ram(tp, seq, hidden, gpus_per_node, host_ram_bytes):
    _positive_int(tp, "tensor-parallel degree (tp)")
    if seq % tp:
        raise ValueError(f"seq ({seq}) must be a multiple of tp ({tp}): sequence parallelism "
                         "splits each layer's input along the sequence over the tensor-parallel "
                         "ranks")
    if hidden % tp:
        raise ValueError(f"hidden size ({hidden}) must be a multiple of tp ({tp}): tensor "
                         "parallelism splits each layer's weights along the hidden dimension "
                         "over the tensor-parallel ranks")
    if tp > gpus_per_node:
        warnings.warn(f"tp ({tp}) exceeds gpus_per_node ({gpus_per_node}): tensor parallelism "
                      "then spans nodes and its all-reduces cross the network (Megatron allows "
                      "it; usually tp <= GPUs per node); the plan assumes it as given",
                      UserWarning, stacklevel=3)
    if isinstance(host_ram_bytes, bool) or not isinstance(host_ram_bytes, int) or \
            host_ram_bytes < 0:
        raise ValueError(f"host_ram_bytes must be a non-negative integer of bytes, got "
                         f"{host_ram_bytes!r}")
    if 0 < host_ram_bytes < MIN_POOL_BYTES:
        raise ValueError(f"host_ram_bytes ({host_ram_bytes} bytes) is below the daemon's "
                         "smallest pool (1 MiB, 1048576 bytes): give the node's host RAM in "
                         "bytes, e.g. 2 << 40 for 2 TiB")


def _check_rates(link_rate, tflops):
    gbps = link_rate / 1e9
    if not MIN_LINK_GBPS <= gbps <= MAX_LINK_GBPS:
        raise ValueError(f"link bandwidth {gbps:g} GB/s is out of range (0.01 to 10000 GB/s): "
                         "give the host link's GB/s per direction, or a preset (pcie4, pcie5, "
                         "h200, nvlink-c2c)")
    if not MIN_TFLOPS <= tflops <= MAX_TFLOPS:
        raise ValueError(f"compute rate {tflops:g} TFLOP/s is out of range (0.001 to 1000000 "
                         "TFLOP/s): give one GPU's sustained rate in TFLOP/s (e.g. 500 for an "
                         "H100 or H200 in bf16)")


def _pool_bytes(with_headroom: int, pinned: int, host_ram_bytes: int) -> int:
    """pool_bytes: the pool with its headroom, at most the host RAM given; 0 when the
    checkpoints alone exceed it."""
    if not host_ram_bytes:
        return with_headroom
    if pinned > host_ram_bytes:
        return 0
    return min(with_headroom, host_ram_bytes)


def _check_gpu_memory(gpu_memory_bytes, gpu_peak_bytes, checkpoint_bytes_per_gpu):
    for value, what in ((gpu_memory_bytes, "gpu_memory_bytes"), (gpu_peak_bytes,
                                                                 "gpu_peak_bytes")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{what} must be a non-negative integer of bytes, got {value!r}")
    if gpu_peak_bytes and not gpu_memory_bytes:
        raise ValueError("gpu_peak_bytes needs gpu_memory_bytes (the GPU memory the run may use "
                         "per GPU)")
    if gpu_peak_bytes and gpu_peak_bytes < checkpoint_bytes_per_gpu:
        raise ValueError(f"gpu_peak_bytes ({gpu_peak_bytes} bytes) is below the checkpoints "
                         f"alone ({checkpoint_bytes_per_gpu} bytes per GPU): measure the peak "
                         "with checkpointing on and offload off, at the same seq and batch")


def plan(model: ModelShape, *, seq: int, batch: int = 1, dtype: str = "bf16",
         gpus_per_node: int = 8, gpus_per_link: int = 1,
         link: Union[str, float] = "h200", tflops: float = 500.0,
         keep_last_n: int = DEFAULT_KEEP_LAST_N, gpu_memory_bytes: int = 0,
         gpu_peak_bytes: int = 0, tp: int = 1, host_ram_bytes: int = 0) -> Plan:
    """Plans checkpoint offload for ``model`` at micro-batch ``batch`` and ``seq`` tokens per GPU
    (after any context-parallel split, before the tensor-parallel one). ``link``: link preset, GPU name (its host link) or GB/s
    per direction; ``tflops``: sustained compute rate in TFLOP/s; ``keep_last_n``: offloadd.torch's
    keep_last_n, the newest n checkpoints stay on the GPU (not offloaded, not in the pool);
    ``gpu_memory_bytes``: GPU memory the run may use per GPU (0: not given); ``gpu_peak_bytes``:
    the run's measured peak per GPU with checkpointing on and offload off (0: not given; needs
    gpu_memory_bytes), which decides whether offload is needed (``decision``; "undecided"
    without it). ``tp``: tensor-parallel degree (Megatron-LM's tensor_model_parallel_size), with
    Megatron sequence parallelism, which Megatron pairs with it: Korthikanti et al., "Reducing
    Activation Recomputation in Large Transformer Models" (2022), section 4.2.2, split the
    layer-norm/dropout regions' activations, the layer input among them, along the sequence
    over the tp ranks, so each GPU holds and offloads b*s*h/tp of every checkpoint and computes
    1/tp of the layer (column/row-parallel matmuls, attention heads split). Without sequence
    parallelism every rank holds the whole layer input (replicated) and this understates the
    bytes per GPU tp times; ``seq`` and the hidden size must be multiples of tp; tp above
    gpus_per_node (tensor parallelism across nodes, which Megatron allows) warns (UserWarning).
    ``link`` must come to 0.01..10000 GB/s and ``tflops`` be 0.001..1e6 ("out of range"
    otherwise). ``host_ram_bytes``: the host RAM
    the node can pin (0: not given): ``pool_bytes`` never exceeds it (capped; 0 and decision
    "host_ram_short" when the checkpoints alone exceed it); given, it must be at least 1 MiB
    (the daemon's smallest pool). Raises ValueError naming the bad
    input."""
    _positive_int(model.layers, "layers")
    _positive_int(model.hidden, "hidden size")
    _positive_int(model.attention_width, "attention width")
    _positive_int(model.params_per_layer, "parameters per layer")
    _positive_int(batch, "micro-batch")
    _positive_int(seq, "sequence length")
    _positive_int(gpus_per_node, "GPUs per node")
    _positive_int(gpus_per_link, "GPUs per link")
    if gpus_per_link > gpus_per_node:
        raise ValueError(f"gpus_per_link ({gpus_per_link}) cannot exceed gpus_per_node "
                         f"({gpus_per_node})")
    if isinstance(tflops, bool) or not (isinstance(tflops, (int, float)) and tflops > 0
                                        and math.isfinite(tflops)):
        raise ValueError(f"compute rate must be a positive number of TFLOP/s, got {tflops!r}")
    if isinstance(keep_last_n, bool) or not isinstance(keep_last_n, int) or keep_last_n < 0:
        raise ValueError(f"keep_last_n must be 0 or more, got {keep_last_n!r}")
    _check_tp_and_host_ram(tp, seq, model.hidden, gpus_per_node, host_ram_bytes)
    link_name, link_rate = resolve_link(link)
    _check_rates(link_rate, tflops)
    d = _dtype(dtype)
    dbytes = DTYPE_BYTES[d]
    rate = float(tflops) * 1e12
    per_gpu_rate = link_rate / gpus_per_link
    per_layer = batch * (seq // tp) * model.hidden * dbytes
    per_gpu = per_layer * model.layers
    offloaded_layers = max(0, model.layers - keep_last_n)
    offloaded = per_layer * offloaded_layers
    per_node = offloaded * gpus_per_node
    if per_gpu >= 2 ** 64 or per_node > 2 ** 62:
        raise ValueError("checkpoint bytes overflow 64 bits: check layers/hidden/batch/seq")
    _check_gpu_memory(gpu_memory_bytes, gpu_peak_bytes, per_gpu)
    headroom = pool_headroom(gpus_per_node)
    pool = math.ceil(per_node * headroom / 2**20) * 2**20
    copy_s = _copy_s(model, batch, seq, dbytes, per_gpu_rate, tp)
    matmul = _matmul_flops(model, batch, seq, tp)
    attention = _attention_flops(model, batch, seq, tp)
    forward_s = (matmul + attention) / rate
    step_s = FORWARDS_PER_STEP * forward_s
    budget = FORWARDS_TO_HIDE_RELOAD * forward_s
    overlaps = copy_s <= budget
    in_flight = _offloads_in_flight_at_backward(offloaded_layers, copy_s, forward_s)
    freed = per_layer * (offloaded_layers - in_flight)
    peak_min = gpu_peak_bytes - freed if gpu_peak_bytes else 0
    return Plan(
        model=model, micro_batch=batch, seq_len=seq, dtype=d, gpus_per_node=gpus_per_node,
        gpus_per_link=gpus_per_link, link=link_name, link_bytes_per_second=link_rate,
        compute_flops_per_second=rate, checkpoint_bytes_per_element=dbytes,
        checkpoint_bytes_per_layer=per_layer, checkpoint_bytes_per_gpu=per_gpu,
        pinned_host_bytes_per_node=per_node, link_bytes_per_second_per_gpu=per_gpu_rate,
        copy_seconds_per_layer=copy_s, matmul_flops_per_layer=matmul,
        attention_flops_per_layer=attention, forward_seconds_per_layer=forward_s,
        copy_to_forward_ratio=copy_s / forward_s,
        sync_slowdown=SYNC_COPIES_PER_LAYER * copy_s / step_s,
        overlap_budget_seconds=budget,
        overlap_slowdown=0.0 if overlaps else (copy_s - budget) / step_s,
        overlaps_fully=overlaps,
        full_overlap_min_seq_len=_full_overlap_min_seq_len(model, batch, dbytes, per_gpu_rate,
                                                           rate, tp),
        host_link=host_link(link_name), keep_last_n=keep_last_n,
        gpu_memory_bytes=gpu_memory_bytes, gpu_peak_bytes=gpu_peak_bytes,
        offloaded_layers=offloaded_layers, offloaded_bytes_per_gpu=offloaded,
        offloads_in_flight_at_backward=in_flight, gpu_bytes_freed_per_gpu=freed,
        tensor_parallel_size=tp, host_ram_bytes=host_ram_bytes, pool_headroom=headroom,
        pool_bytes_with_headroom=pool, pool_bytes=_pool_bytes(pool, per_node, host_ram_bytes),
        gpu_peak_with_offload_min_bytes=peak_min,
        decision=_decide(offloaded_layers, gpu_memory_bytes, gpu_peak_bytes, peak_min, overlaps,
                         bool(host_ram_bytes) and per_node > host_ram_bytes))


def default_sweep_seq_lens() -> List[int]:
    """1K, 2K, ... 512K tokens, the range of [ref]'s examples."""
    return [1024 << k for k in range(10)]


def sweep(model: ModelShape, seq_lens: Optional[Sequence[int]] = None, **kwargs) -> List[Plan]:
    """plan() at each sequence length (default: default_sweep_seq_lens())."""
    seqs = list(seq_lens) if seq_lens is not None else default_sweep_seq_lens()
    if not seqs:
        raise ValueError("sweep needs at least one sequence length")
    return [plan(model, seq=s, **kwargs) for s in seqs]


def _config_int(cfg: dict, key: str, required: bool) -> int:
    v = cfg.get(key)
    if v is None:
        if not required:
            return 0
        raise ValueError(f'config.json has no "{key}": a dense Llama/Qwen-style config is '
                         "needed, or give layers/hidden/attention_width/params_per_layer")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 1 or v > 1e12 or v != int(v):
        raise ValueError(f'config.json field "{key}" must be a positive integer')
    return int(v)


def model_from_hf_config_dict(root: dict) -> ModelShape:
    """ModelShape of a dense Llama/Qwen-style model from a parsed config.json (see
    model_from_hf_config). Raises ValueError for missing fields or a mixture-of-experts config."""
    if not isinstance(root, dict):
        raise ValueError("config.json must hold a JSON object")
    cfg = root
    if "num_hidden_layers" not in cfg and isinstance(cfg.get("text_config"), dict):
        cfg = cfg["text_config"]
    for moe_key in ("num_experts", "num_local_experts", "n_routed_experts"):
        v = cfg.get(moe_key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            raise ValueError(f"config.json describes a mixture-of-experts model ({moe_key}): "
                             "derivation covers dense models only; give params_per_layer "
                             "counting the active experts")
    layers = _config_int(cfg, "num_hidden_layers", True)
    hidden = _config_int(cfg, "hidden_size", True)
    heads = _config_int(cfg, "num_attention_heads", True)
    intermediate = _config_int(cfg, "intermediate_size", True)
    kv_heads = _config_int(cfg, "num_key_value_heads", False) or heads
    head_dim = _config_int(cfg, "head_dim", False)
    if head_dim == 0:
        if hidden % heads:
            raise ValueError(f"config.json: hidden_size {hidden} is not divisible by "
                             f'num_attention_heads {heads}; add "head_dim"')
        head_dim = hidden // heads
    name = ""
    for key in ("_name_or_path", "model_type"):
        if isinstance(root.get(key), str) and root[key]:
            name = root[key]
            break
    return ModelShape(layers=layers, hidden=hidden, attention_width=heads * head_dim,
                      params_per_layer=dense_layer_params(hidden, heads, kv_heads, head_dim,
                                                          intermediate),
                      name=name, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      head_dim=head_dim, intermediate_size=intermediate)


def model_from_hf_config(path: str) -> ModelShape:
    """Reads a Hugging Face config.json: num_hidden_layers, hidden_size, num_attention_heads,
    intermediate_size, num_key_value_heads (default: heads), head_dim (default: hidden / heads,
    the Llama convention). A top-level "text_config" object is used when the top level has no
    num_hidden_layers. Raises ValueError (bad content) or OSError (unreadable file)."""
    with open(path, encoding="utf-8") as f:
        try:
            root = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: invalid JSON: {e}") from None
    return model_from_hf_config_dict(root)


def _bytes(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"


def _overlap_line(p: Plan) -> str:
    if p.full_overlap_min_seq_len == NEVER_OVERLAPS:
        return "never (reload exceeds 3 forwards at every practical length)"
    if p.full_overlap_min_seq_len <= 1:
        return "at every sequence length (copy/forward falls as s grows: no largest s)"
    return (f"for s >= {p.full_overlap_min_seq_len:,} tokens (copy/forward falls as s grows: "
            "no largest s)")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def _row(label: str, value: str, note: str) -> str:
    return f"{label:<28} {value:<14} {note}".rstrip()


def _gpu_memory_rows(p: Plan) -> List[str]:
    if not p.gpu_memory_bytes:
        return []
    note = "(--gpu-memory)"
    if not p.gpu_peak_bytes:
        note = (f"(--gpu-memory; the checkpoints alone are "
                f"{100.0 * p.checkpoint_bytes_per_gpu / p.gpu_memory_bytes:.1f} % of it; give "
                "--gpu-peak to decide whether offload is needed)")
    rows = [_row("GPU memory per GPU", _bytes(p.gpu_memory_bytes), note)]
    if p.gpu_peak_bytes:
        rows += [_row("peak without offload", _bytes(p.gpu_peak_bytes),
                      "(--gpu-peak: measured with checkpointing, offload off)"),
                 *_peak_with_offload_rows(p)]
    return rows


def _fit_note(peak_bytes: int, gpu_memory_bytes: int) -> str:
    """'fits the GPU's 80.00 GiB' or 'does not fit the GPU's 80.00 GiB' (both in bytes)."""
    word = "fits" if peak_bytes <= gpu_memory_bytes else "does not fit"
    return f"{word} the GPU's {_bytes(gpu_memory_bytes)}"


def _peak_with_offload_rows(p: Plan) -> List[str]:
    """The two ends of the peak with offload, each with when it applies and whether it fits."""
    low, high, gpu = p.gpu_peak_with_offload_min_bytes, p.gpu_peak_bytes, p.gpu_memory_bytes
    high_note = ("if the peak comes elsewhere, where offload does not lower it: "
                 + _fit_note(high, gpu))
    if low <= gpu < high:
        high_note += "; measure the peak with offload on to tell which"
    return [_row("peak with offload, at least", _bytes(low),
                 "if the peak comes at the end of forward, where every checkpoint is held: "
                 + _fit_note(low, gpu)),
            _row("peak with offload, at most", _bytes(high), high_note)]


_HEADLINES = {"nothing_to_offload": "nothing to offload", "not_needed": "offload not needed",
              "does_not_fit": "offload alone does not fit", "host_ram_short": "host RAM short",
              "undecided": "cannot decide", "cannot_hide": "offload cannot hide the copy",
              "offload": "offload"}

_HOST_RAM_ADVICE = ("lower --seq or --batch, raise --keep-last-n, or give --nvme-gbps to plan "
                    "the spill tier")


def _reload_clause(p: Plan) -> str:
    if p.overlaps_fully:
        return (f"a reload takes {_ms(p.copy_seconds_per_layer)}, hidden behind "
                f"{_ms(p.overlap_budget_seconds)} of recompute + backward")
    return (f"a reload takes {_ms(p.copy_seconds_per_layer)} against "
            f"{_ms(p.overlap_budget_seconds)} of recompute + backward: the step is "
            f"{p.overlap_slowdown * 100:.1f} % slower")


def _decision_row(p: Plan) -> str:
    if p.decision == "nothing_to_offload":
        why = (f"keep_last_n={p.keep_last_n} keeps all {p.model.layers} checkpoints on the GPU; "
               "lower --keep-last-n to offload")
    elif p.decision == "not_needed":
        why = (f"the peak {_bytes(p.gpu_peak_bytes)} fits the GPU's "
               f"{_bytes(p.gpu_memory_bytes)}; keep checkpointing and leave offload off")
    elif p.decision == "does_not_fit":
        why = (f"at best the peak falls to {_bytes(p.gpu_peak_with_offload_min_bytes)}, above "
               f"the GPU's {_bytes(p.gpu_memory_bytes)}; shard further, lower --seq or --batch "
               "as well")
    elif p.decision == "host_ram_short":
        why = (f"the offloaded checkpoints need {_bytes(p.pinned_host_bytes_per_node)} of pinned "
               f"host RAM per node, above the node's {_bytes(p.host_ram_bytes)} (--host-ram); "
               f"{_HOST_RAM_ADVICE}")
    elif p.decision == "undecided":
        memory = "" if p.gpu_memory_bytes else "--gpu-memory SIZE and "
        why = ("whether offload is needed: without the run's peak the planner cannot tell; pass "
               f"{memory}--gpu-peak SIZE (measured with checkpointing on, offload off); if "
               f"needed, {_reload_clause(p)}")
    elif p.decision == "cannot_hide":
        why = (f"a reload takes {_ms(p.copy_seconds_per_layer)} against "
               f"{_ms(p.overlap_budget_seconds)} of recompute + backward: the step is "
               f"{p.overlap_slowdown * 100:.1f} % slower; a faster link, fewer GPUs per link or "
               "a longer --seq hides it")
    else:
        why = (f"a reload takes {_ms(p.copy_seconds_per_layer)}, hidden behind "
               f"{_ms(p.overlap_budget_seconds)} of recompute + backward; frees "
               f"{_bytes(p.gpu_bytes_freed_per_gpu)} per GPU")
    return _row("decision", _HEADLINES[p.decision], f"({why})")


def enable_call(p: Plan) -> str:
    """The ``offloadd.transformers.enable(...)`` call that follows from the plan: its
    keep_last_n, prefetch=1 (the reload of one layer hides behind the next layer's recompute and
    backward), and threshold_bytes when a checkpoint is below offloadd.torch's default
    threshold (it would stay on the GPU otherwise)."""
    args = f"keep_last_n={p.keep_last_n}, prefetch=1"
    if p.checkpoint_bytes_per_layer < DEFAULT_THRESHOLD_BYTES:
        args += f", threshold_bytes={p.checkpoint_bytes_per_layer}"
    return f"offloadd.transformers.enable({args})"


def format_settings(p: Plan) -> str:
    """The settings to paste, as ``offloadctl plan`` prints them after the figures: the enable()
    call (and offloadd.torch's context for plain torch) and the daemon's pool_bytes line
    (pinned host RAM per node x pool_headroom); one "none" line when offload stays off."""
    if p.decision in ("not_needed", "nothing_to_offload"):
        return _row("settings", "none", "(no enable() call and no pool: offload stays off)") + "\n"
    call = enable_call(p)
    torch_call = "offloadd.torch.offload_checkpoints" + call[call.index("("):]
    return "\n".join([
        _row("enable()", call, "then model.activation_checkpointing_enable(offload=True)"),
        _row("", f"(plain torch: `with {torch_call}:` around forward)", ""),
        _pool_line(p),
    ]) + "\n"


def _pool_line(p: Plan) -> str:
    """The daemon's pool_bytes line: as planned, capped at host_ram_bytes, or none."""
    if p.host_ram_bytes and p.pinned_host_bytes_per_node > p.host_ram_bytes:
        return _row("offloadd.conf", "pool_bytes: none",
                    f"(no pool fits: the checkpoints need {_bytes(p.pinned_host_bytes_per_node)} "
                    f"pinned per node, the node has {_bytes(p.host_ram_bytes)} (--host-ram); "
                    f"{_HOST_RAM_ADVICE})")
    if p.pool_bytes < p.pool_bytes_with_headroom:
        return _row("offloadd.conf", f"pool_bytes: {p.pool_bytes}",
                    "(capped at the node's host RAM, --host-ram; the allocator headroom wants "
                    f"{p.pool_bytes_with_headroom}: a step whose pool fragments may wait for "
                    "space)")
    return _row("offloadd.conf", f"pool_bytes: {p.pool_bytes}",
                f"(pinned host RAM per node x {p.pool_headroom:.2f} allocator headroom, "
                f"{p.gpus_per_node} rank(s) sharing the pool)")


def format_plan(p: Plan) -> str:
    """Human-readable report, the same text as ``offloadctl plan`` prints for one plan (without
    --nvme-gbps): the figures (ms 2 decimals, % 1 decimal, MiB/GiB 2 decimals), the GPU memory
    lines, the decision line, then :func:`format_settings`."""
    m = p.model
    ms = _ms
    rows = [
        ("checkpoint per layer", _bytes(p.checkpoint_bytes_per_layer),
         f"({p.checkpoint_bytes_per_layer:,} bytes)"),
        ("checkpoint per GPU", _bytes(p.checkpoint_bytes_per_gpu),
         f"({p.checkpoint_bytes_per_gpu:,} bytes)"),
        ("GPU memory freed per GPU", _bytes(p.gpu_bytes_freed_per_gpu),
         f"({p.offloaded_layers} of {m.layers} layers offloaded{_in_flight(p)}; "
         f"keep_last_n={p.keep_last_n} keeps {min(p.keep_last_n, m.layers)} on the GPU)"),
        ("pinned host RAM per node", _bytes(p.pinned_host_bytes_per_node),
         f"({p.pinned_host_bytes_per_node:,} bytes)"),
        ("copy per layer, each way", ms(p.copy_seconds_per_layer), ""),
        ("forward per layer", ms(p.forward_seconds_per_layer),
         f"(matmul {ms(p.matmul_flops_per_layer / p.compute_flops_per_second)} + attention "
         f"{ms(p.attention_flops_per_layer / p.compute_flops_per_second)})"),
        ("copy / forward", f"{p.copy_to_forward_ratio * 100:.1f} %", ""),
        ("synchronous slowdown", f"{p.sync_slowdown * 100:.1f} %",
         "(2 copies over 4 forwards per layer)"),
        ("overlapped slowdown", f"{p.overlap_slowdown * 100:.1f} %",
         f"(reload hides behind 3 forwards = {ms(p.overlap_budget_seconds)})"),
        ("reload overlaps fully", _overlap_line(p), ""),
    ]
    out = [f"{m.name or 'model'}: {m.layers} layers, hidden {m.hidden}, attention width "
           f"{m.attention_width}, {m.params_per_layer:,} params/layer",
           f"  micro-batch {p.micro_batch}, {p.dtype} checkpoints "
           f"({p.checkpoint_bytes_per_element} bytes/element), {p.gpus_per_node} GPUs/node, "
           f"{p.gpus_per_link} GPU(s) per link{_tp_note(p)}",
           f"  link {_link_name(p)} {p.link_bytes_per_second / 1e9:.2f} GB/s per direction = "
           f"{p.link_bytes_per_second_per_gpu / 1e9:.2f} GB/s per GPU; compute "
           f"{p.compute_flops_per_second / 1e12:g} TFLOP/s sustained",
           f"  sequence {p.seq_len:,} tokens per GPU{_tp_sequence(p)}"]
    for label, value, note in rows:
        out.append(_row(label, value, note))
    out += _gpu_memory_rows(p)
    out.append(_decision_row(p))
    return "\n".join(out) + "\n" + format_settings(p)


def _tp_note(p: Plan) -> str:
    if p.tensor_parallel_size <= 1:
        return ""
    return f", tensor-parallel {p.tensor_parallel_size} (sequence-parallel)"


def _tp_sequence(p: Plan) -> str:
    if p.tensor_parallel_size <= 1:
        return ""
    return f" group, {p.seq_len // p.tensor_parallel_size:,} in each GPU's checkpoint share"


def _in_flight(p: Plan) -> str:
    if not p.offloads_in_flight_at_backward:
        return ""
    return (f", {p.offloads_in_flight_at_backward} still copying when backward starts: "
            "copy > forward")


def _link_name(p: Plan) -> str:
    if not p.host_link or p.host_link == p.link:
        return p.link
    return f"{p.link} ({p.host_link})"


def format_plan_json(p: Plan) -> str:
    """One JSON object with the same keys as ``offloadctl plan --json``."""
    return json.dumps(p.to_dict())
