"""Random-init Qwen3 models for the real-stack tests (no weights are ever fetched from a hub).

SEED_CONFIG is the model of the reference study's CPU experiment
(../shared/reference/activation-checkpoint-offload.txt, "What I ran"): Qwen3ForCausalLM with 8
layers, hidden 512, MLP 2048, 8 query and 4 KV heads (head_dim 64), vocabulary 1024, fp32, run at
batch 2 x sequence 2048. Each checkpointed layer's input is (2, 2048, 512) fp32 = 8,388,608 bytes,
8 of them 67,108,864 bytes a step; the study's loss, 7.029450416564941, is reproduced bit for bit
(it fixes the vocabulary the study did not state: ln(1024) = 6.93).
"""

import contextlib
import warnings

import torch

SEED_CONFIG = dict(vocab_size=1024, hidden_size=512, intermediate_size=2048,
                   num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                   head_dim=64)
SEED_BATCH, SEED_SEQ = 2, 2048
SEED_LOSS = 7.029450416564941   # the study's figure, measured with torch 2.14.1 / transformers 5.20.1

SMALL_CONFIG = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=64)


def make_model(seed=0, max_seq=2048, attn_implementation=None, **config):
    """A Qwen3ForCausalLM in training mode, parameters from torch.manual_seed(seed);
    ``attn_implementation`` (e.g. "eager") as Transformers' config takes it (default: sdpa)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM
    cfg = Qwen3Config(max_position_embeddings=max_seq, **config)
    if attn_implementation is not None:
        cfg._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg)
    model.train()
    return model


def batch(vocab, b, s, seed=1):
    """Random token ids (b, s) int64 from a fixed generator."""
    return torch.randint(0, vocab, (b, s), generator=torch.Generator().manual_seed(seed))


def set_checkpointing(model, mode):
    """mode: "none" (no checkpointing), "ckpt" (non-reentrant checkpointing, Transformers'
    default), "offload" (checkpointing with offload=True: each layer call inside
    transformers.modeling_utils.save_on_cpu), "reentrant" (use_reentrant=True)."""
    if mode == "none":
        model.gradient_checkpointing_disable()
        return
    kwargs = {"use_reentrant": True} if mode == "reentrant" else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # gradient_checkpointing_enable's alias
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs,
                                                  offload=mode == "offload")
        else:  # Transformers releases before the rename take the same switch under the old name
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs,
                                                offload=mode == "offload")


def step(model, ids, between=None):
    """One forward + backward (labels = ids). ``between()`` runs after forward, before backward.
    Returns (loss, [grads]) detached and cloned, and zeroes the gradients."""
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids)
    if between is not None:
        between()
    out.loss.backward()
    grads = [p.grad.detach().clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return out.loss.detach().clone(), grads


def bitwise_equal(a, b):
    """True when two (loss, grads) results are bitwise identical."""
    return torch.equal(a[0], b[0]) and len(a[1]) == len(b[1]) and \
        all(torch.equal(x, y) for x, y in zip(a[1], b[1]))


@contextlib.contextmanager
def torch_save_on_cpu_without_pinning():
    """Transformers' offload path with torch's own save_on_cpu, runnable on a CPU-only host.

    Transformers passes device_type="cpu" with pin_memory=True when there is no accelerator, and
    torch's save_on_cpu then raises ("pin_memory=True requires a CUDA or other accelerator
    backend"). As the reference study did, the hook path stays torch's own; only pinning is off
    (there is no device to copy from on a CPU host).
    """
    import transformers.modeling_utils as mu
    orig = mu.save_on_cpu

    def unpinned(pin_memory=False, device_type="cuda"):
        return torch.autograd.graph.save_on_cpu(pin_memory=False, device_type=device_type)
    mu.save_on_cpu = unpinned
    try:
        yield
    finally:
        mu.save_on_cpu = orig


def wrap_packs(store, wrap, context=None):
    """Wraps every pack hook offloadd's ``store`` gives torch from now on (its ``hook_pair``:
    contexts made later, save_on_cpu instances made per layer call) and ``context``'s
    (offload_checkpoints) in ``wrap(pack)``, the hook torch then calls. Returns the function
    that undoes it."""
    pair = store.hook_pair

    def wrapped_pair(*args, **kwargs):
        pack, unpack = pair(*args, **kwargs)
        return wrap(pack), unpack
    store.hook_pair = wrapped_pair
    inner = context.pack_hook if context is not None else None
    if context is not None:
        context.pack_hook = wrap(inner)

    def undo():
        del store.hook_pair
        if context is not None:
            context.pack_hook = inner
    return undo


@contextlib.contextmanager
def spy_on_store(store, context=None):
    """Records (shape, dtype) of every tensor ``store``'s pack hook sees, in order. Contexts made
    later (save_on_cpu per layer call) pick the spy up from the store; pass an existing
    ``context`` (offload_checkpoints) to wrap its bound hook too."""
    seen = []

    def wrap(pack):
        def spy(t, *a, **k):
            seen.append((tuple(t.shape), t.dtype))
            return pack(t, *a, **k)
        return spy
    undo = wrap_packs(store, wrap, context)
    try:
        yield seen
    finally:
        undo()
