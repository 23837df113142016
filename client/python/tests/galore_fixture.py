"""Small random-init Llama models and GaLore training runs for the offloadd.galore tests (no
weights are ever fetched from a hub).

TINY: LlamaForCausalLM, 2 layers, hidden 32, MLP 64, 2 query / 1 KV heads of 16, vocabulary 128:
7 nn.Linear weights a layer (q, k, v, o, gate, up, down) = 14 GaLore matrices, plus lm_head when
``optim_target_modules`` matches it (it does not: the targets are "attn" and "mlp"). A step of
batch 2 x sequence 16 takes milliseconds on a CPU core.
"""

import contextlib
import tempfile
import warnings

import torch

TINY = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, head_dim=16)
TARGETS = ["attn", "mlp"]
OPTIM_ARGS = "rank=8, update_proj_gap=5, scale=0.25"
BATCH, SEQ = 2, 16


def make_model(seed=0, **config):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(max_position_embeddings=max(SEQ, 64), **(config or TINY))
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    model.train()
    return model


def dataset(steps, vocab=TINY["vocab_size"], batch=BATCH, seq=SEQ, seed=5):
    ids = torch.randint(0, vocab, (batch * steps, seq), generator=torch.Generator().manual_seed(seed))
    return [{"input_ids": row, "labels": row} for row in ids]


def galore_groups(model, rank=8, gap=5, scale=0.25):
    """The Trainer's split: the targets' nn.Linear weights in a GaLore group, the rest plain."""
    target = [p for n, p in model.named_parameters()
              if n.endswith(".weight") and any(t in n for t in TARGETS) and p.dim() == 2]
    ids = {id(p) for p in target}
    rest = [p for p in model.parameters() if id(p) not in ids]
    return [{"params": rest},
            {"params": target, "rank": rank, "update_proj_gap": gap, "scale": scale,
             "proj_type": "std"}]


def train(optim="galore_adamw", steps=30, optim_args=OPTIM_ARGS, save_steps=None,
          resume_from=None, output_dir=None, seed=0, lr=1e-2, data_steps=30, device="cpu"):
    """Runs transformers.Trainer for ``steps`` steps; returns (losses: list of float tensors, one
    per step, model). ``save_steps``: checkpoint every that many steps into ``output_dir``;
    ``resume_from``: a checkpoint directory to resume from; ``data_steps``: the dataset's size in
    steps (the same for runs that are compared: the Trainer shuffles by its length)."""
    import transformers
    transformers.logging.set_verbosity_error()  # "matched but ignored" for non-Linear targets
    model = make_model(seed)
    losses = []

    class Recording(transformers.Trainer):
        def training_step(self, *a, **k):
            loss = super().training_step(*a, **k)
            losses.append(loss.detach().clone())
            return loss

    with contextlib.ExitStack() as stack:
        out = output_dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="ofd-galore-"))
        args = transformers.TrainingArguments(
            output_dir=out, max_steps=steps, per_device_train_batch_size=BATCH,
            learning_rate=lr, use_cpu=device == "cpu", report_to=[], logging_strategy="no",
            save_strategy="steps" if save_steps else "no", save_steps=save_steps or 500,
            dataloader_num_workers=0, seed=seed, data_seed=seed, disable_tqdm=True,
            optim=optim, optim_target_modules=TARGETS, optim_args=optim_args,
            lr_scheduler_type="constant", max_grad_norm=0.0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            Recording(model=model, args=args, train_dataset=dataset(data_steps)).train(
                resume_from_checkpoint=resume_from)
    return losses, model


@contextlib.contextmanager
def stock_sign_flips(seed):
    """Stock galore-torch with the signs of its singular vectors flipped at random (a fixed
    generator): what sign freedom alone changes in the results."""
    import galore_torch.galore_projector as gp
    original = gp.GaLoreProjector.get_orthogonal_matrix
    gen = torch.Generator().manual_seed(seed)

    def flipped(self, weights, rank, type):  # noqa: A002 - galore-torch's argument name
        m = original(self, weights, rank, type)
        if type == "left":
            signs = torch.randint(0, 2, (m.shape[1],), generator=gen) * 2 - 1
            return m * signs.to(m.dtype)
        signs = torch.randint(0, 2, (m.shape[0],), generator=gen) * 2 - 1
        return m * signs.to(m.dtype)[:, None]
    gp.GaLoreProjector.get_orthogonal_matrix = flipped
    try:
        yield
    finally:
        gp.GaLoreProjector.get_orthogonal_matrix = original


def align_to_torch_svd(projector, grad, p):
    """Test hook for offloadd.galore._TEST_HOOKS["adopted"]: flips the columns of ``p`` (side_dim
    x r) to the signs of torch.linalg.svd's singular vectors of ``grad`` (stock's computation)."""
    if grad is None:
        return p
    u, _, vh = torch.linalg.svd(grad.detach().float(), full_matrices=False)
    r = p.shape[1]
    ref = u[:, :r] if projector._side_of(grad) == "left" else vh[:r, :].t()
    signs = torch.sign((ref * p.float()).sum(0))
    signs[signs == 0] = 1
    return (p.float() * signs).to(p.dtype)


def relative(a, b):
    return abs(a - b) / max(abs(b), 1e-30)
