"""A small decoder-only transformer for the offloadd examples, tests and benchmark.

Pre-norm blocks of RMSNorm -> causal self-attention with rotary position embeddings (RoPE) ->
residual, RMSNorm -> SwiGLU MLP -> residual; a final RMSNorm and an untied LM head; character
tokens. Sources of the pieces: RMSNorm (Zhang & Sennrich 2019, "Root Mean Square Layer
Normalization"), RoPE (Su et al. 2021, "RoFormer"; the rotate-half form), SwiGLU (Shazeer 2020,
"GLU Variants Improve Transformer"; hidden width 8/3 * h rounded up to a multiple of 8).

Shapes: token ids (b, s) int64; hidden states (b, s, h) in the parameter dtype; logits
(b, s, vocab). Each block is checkpointed in the checkpointing modes, so a step keeps exactly
one (b, s, h) tensor per layer for backward: the layer input.

``TinyLM.forward(idx, targets, mode, context)`` modes (how the blocks run):
  plain              no checkpointing
  checkpoint         torch.utils.checkpoint, non-reentrant
  reentrant          torch.utils.checkpoint, reentrant
  hooks              ``with context:`` around torch.utils.checkpoint (non-reentrant)
  hooks-reentrant    ``with context:`` around reentrant torch.utils.checkpoint
  offloadd           offloadd.torch.checkpoint(block, x, context=context), non-reentrant
  torch-save-on-cpu  ``with torch.autograd.graph.save_on_cpu():`` around torch checkpoint, the
                     way Transformers' gradient_checkpointing_enable(offload=True) does
"""

import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as tcp

TORCH_MAJOR = int(torch.__version__.split(".")[0])
MODES = ("plain", "checkpoint", "reentrant", "hooks", "hooks-reentrant", "offloadd",
         "torch-save-on-cpu")
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "tiny_corpus.txt")


class RMSNorm(nn.Module):
    def __init__(self, h, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(h))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary(x, base=10000.0):
    """Applies RoPE (rotate-half form) to x of shape (b, heads, s, d), d even."""
    s, d = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / base ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    angles = torch.outer(torch.arange(s, device=x.device, dtype=torch.float32), inv_freq)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class Attention(nn.Module):
    def __init__(self, h, heads):
        super().__init__()
        assert h % heads == 0 and (h // heads) % 2 == 0
        self.heads = heads
        self.qkv = nn.Linear(h, 3 * h, bias=False)
        self.out = nn.Linear(h, h, bias=False)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        q, k = rotary(q), rotary(k)
        scores = q @ k.transpose(-2, -1) / math.sqrt(h // self.heads)
        causal = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        attn = scores.masked_fill(causal, float("-inf")).softmax(-1)
        return self.out((attn @ v).transpose(1, 2).reshape(b, s, h))


class SwiGLU(nn.Module):
    def __init__(self, h):
        super().__init__()
        m = (8 * h // 3 + 7) // 8 * 8
        self.gate = nn.Linear(h, m, bias=False)
        self.up = nn.Linear(h, m, bias=False)
        self.down = nn.Linear(m, h, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, h, heads):
        super().__init__()
        self.norm1, self.attn = RMSNorm(h), Attention(h, heads)
        self.norm2, self.mlp = RMSNorm(h), SwiGLU(h)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab, layers=4, hidden=64, heads=4):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.norm = RMSNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def run_blocks(self, x, mode="plain", context=None):
        if mode == "offloadd":
            import offloadd.torch as ot
            for block in self.blocks:
                x = ot.checkpoint(block, x, context=context, use_reentrant=False)
            return x
        if mode in ("hooks", "hooks-reentrant", "torch-save-on-cpu"):
            reentrant = mode == "hooks-reentrant"
            for block in self.blocks:
                ctx = context if mode != "torch-save-on-cpu" else \
                    torch.autograd.graph.save_on_cpu()
                with ctx:
                    x = tcp.checkpoint(block, x, use_reentrant=reentrant)
            return x
        for block in self.blocks:
            if mode == "plain":
                x = block(x)
            elif mode in ("checkpoint", "reentrant"):
                x = tcp.checkpoint(block, x, use_reentrant=mode == "reentrant")
            else:
                raise ValueError("unknown mode %r (one of %s)" % (mode, ", ".join(MODES)))
        return x

    def forward(self, idx, targets, mode="plain", context=None):
        """Mean cross-entropy loss (scalar) of next-token prediction; idx, targets (b, s)."""
        x = self.run_blocks(self.embed(idx), mode, context)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


class CharData:
    """Character tokens of a text; ``batch(b, s, generator)`` samples (idx, targets) windows."""

    def __init__(self, path=DATA):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        self.chars = sorted(set(text))
        index = {c: i for i, c in enumerate(self.chars)}
        self.tokens = torch.tensor([index[c] for c in text], dtype=torch.long)

    @property
    def vocab(self):
        return len(self.chars)

    def batch(self, b, s, generator):
        starts = torch.randint(0, len(self.tokens) - s - 1, (b,), generator=generator)
        idx = torch.stack([self.tokens[i:i + s] for i in starts.tolist()])
        tgt = torch.stack([self.tokens[i + 1:i + s + 1] for i in starts.tolist()])
        return idx, tgt


def make_model(vocab, layers, hidden, heads, seed=0, dtype=torch.float32, device="cpu"):
    torch.manual_seed(seed)
    return TinyLM(vocab, layers, hidden, heads).to(device=device, dtype=dtype)
