"""A small GPT (decoder-only transformer) whose attention is the course's dispatcher.

Plain PyTorch, nothing from a model hub: token and position embeddings, ``layers`` blocks of
pre-norm causal self-attention and a 4x MLP, a final norm and a head tied to the embedding.
Every attention call goes through ``capstone.dispatch.attention(..., impl=cfg.attn)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import dispatch


@dataclass
class GPTConfig:
    vocab: int = 256            # bytes
    context: int = 128
    layers: int = 2
    d_model: int = 64
    heads: int = 2
    attn: str = "auto"          # capstone.dispatch impl, or a baseline (dispatch.BASELINES)
    code: str | None = None     # folder the steps come from (None: $ATTN_IMPL or solutions)


# layers, d_model, heads (head dim 64 from `small` up), context
SIZES = {"tiny": (2, 64, 2, 128), "small": (6, 512, 8, 1024), "medium": (12, 1024, 16, 4096)}


def config(size="tiny", **kw) -> GPTConfig:
    layers, d, heads, context = SIZES[size]
    return GPTConfig(**{"layers": layers, "d_model": d, "heads": heads, "context": context, **kw})


class SelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x):                                                   # (B, T, C)
        B, T, C = x.shape
        h = self.cfg.heads
        q, k, v = self.qkv(x).view(B, T, 3, h, C // h).permute(2, 0, 3, 1, 4)   # 3 x (B, h, T, d)
        y = dispatch.attention(q, k, v, is_causal=True, impl=self.cfg.attn, code=self.cfg.code)  # (B, h, T, d)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.attn = SelfAttention(cfg)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(),
                                 nn.Linear(4 * cfg.d_model, cfg.d_model))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.context, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln = nn.LayerNorm(cfg.d_model)
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx, targets=None):                                   # idx: (B, T) int64
        T = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.ln(x) @ self.tok.weight.t()                          # tied head: (B, T, vocab)
        if targets is None:
            return logits
        return logits, F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
