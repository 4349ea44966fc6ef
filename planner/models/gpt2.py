"""GPT-2 exactly as LLMs-from-scratch's GPTModel builds it (ch04 `previous_chapters.py`).

Same module and parameter names, the same persistent fp32 causal-mask buffer per block, so a
`model.pth` saved by the book's code loads with strict=True. With attention="eager" the forward pass
is the book's op for op (manual LayerNorm, tanh GELU, manual attention with masked_fill_, dropout
placement): activation memory depends on exactly which tensors autograd saves, so "close enough" is
not close enough. attention="sdpa" swaps in F.scaled_dot_product_attention(is_causal=True).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


class MultiHeadAttention(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False, attention="eager"):
        super().__init__()
        assert d_out % num_heads == 0, "d_out must be divisible by num_heads"
        self.d_out = d_out
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))
        self.attention = attention

    def forward(self, x):
        b, num_tokens, d_in = x.shape
        keys = self.W_key(x)
        queries = self.W_query(x)
        values = self.W_value(x)

        keys = keys.view(b, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)
        queries = queries.view(b, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)
        values = values.view(b, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)

        if self.attention == "sdpa":
            context_vec = F.scaled_dot_product_attention(
                queries, keys, values, dropout_p=self.dropout.p if self.training else 0.0, is_causal=True)
        else:
            attn_scores = queries @ keys.transpose(2, 3)
            mask_bool = self.mask.bool()[:num_tokens, :num_tokens]
            attn_scores.masked_fill_(mask_bool, -torch.inf)
            attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
            attn_weights = self.dropout(attn_weights)
            context_vec = attn_weights @ values

        context_vec = context_vec.transpose(1, 2)
        context_vec = context_vec.contiguous().view(b, num_tokens, self.d_out)
        return self.out_proj(context_vec)


class LayerNorm(nn.Module):
    def __init__(self, emb_dim):
        super().__init__()
        self.eps = 1e-5
        self.scale = nn.Parameter(torch.ones(emb_dim))
        self.shift = nn.Parameter(torch.zeros(emb_dim))

    def forward(self, x):
        mean = x.mean(dim=-1, keepdim=True)
        var = x.var(dim=-1, keepdim=True, unbiased=False)
        norm_x = (x - mean) / torch.sqrt(var + self.eps)
        return self.scale * norm_x + self.shift


class GELU(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1 + torch.tanh(
            torch.sqrt(torch.tensor(2.0 / torch.pi)) * (x + 0.044715 * torch.pow(x, 3))))


class FeedForward(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(cfg["emb_dim"], 4 * cfg["emb_dim"]),
            GELU(),
            nn.Linear(4 * cfg["emb_dim"], cfg["emb_dim"]),
        )

    def forward(self, x):
        return self.layers(x)


class TransformerBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.att = MultiHeadAttention(
            d_in=cfg["emb_dim"], d_out=cfg["emb_dim"], context_length=cfg["context_length"],
            num_heads=cfg["n_heads"], dropout=cfg["drop_rate"], qkv_bias=cfg["qkv_bias"],
            attention=cfg.get("attention", "eager"))
        self.ff = FeedForward(cfg)
        self.norm1 = LayerNorm(cfg["emb_dim"])
        self.norm2 = LayerNorm(cfg["emb_dim"])
        self.drop_shortcut = nn.Dropout(cfg["drop_rate"])

    def forward(self, x):
        shortcut = x
        x = self.norm1(x)
        x = self.att(x)
        x = self.drop_shortcut(x)
        x = x + shortcut

        shortcut = x
        x = self.norm2(x)
        x = self.ff(x)
        x = self.drop_shortcut(x)
        x = x + shortcut
        return x


class GPTModel(nn.Module):
    """Takes the book's config dict (or a GPT2Config); `gradient_checkpointing` recomputes each block."""

    def __init__(self, cfg):
        super().__init__()
        if not isinstance(cfg, dict):  # a GPT2Config (planner/arch/gpt2_book.py): its fields by name
            cfg = {k: getattr(cfg, k) for k in ("vocab_size", "context_length", "emb_dim", "n_heads",
                                                 "n_layers", "drop_rate", "qkv_bias", "attention")}
        self.tok_emb = nn.Embedding(cfg["vocab_size"], cfg["emb_dim"])
        self.pos_emb = nn.Embedding(cfg["context_length"], cfg["emb_dim"])
        self.drop_emb = nn.Dropout(cfg["drop_rate"])
        self.trf_blocks = nn.Sequential(*[TransformerBlock(cfg) for _ in range(cfg["n_layers"])])
        self.final_norm = LayerNorm(cfg["emb_dim"])
        self.out_head = nn.Linear(cfg["emb_dim"], cfg["vocab_size"], bias=False)
        self.gradient_checkpointing = False
        self.checkpoint_every = 1    # blocks i % checkpoint_every == 0 are checkpointed (planner/checkpointing.py)
        self.checkpoint_kwargs = {}  # e.g. a selective policy's context_fn

    def forward(self, in_idx):
        """The book's forward, op for op and name for name: its locals (tok_embeds, pos_embeds, the final norm's
        output) live until it returns, as in the book, and the measured peak depends on that."""
        batch_size, seq_len = in_idx.shape
        tok_embeds = self.tok_emb(in_idx)
        pos_embeds = self.pos_emb(torch.arange(seq_len, device=in_idx.device))
        x = tok_embeds + pos_embeds
        x = self.drop_emb(x)
        if self.gradient_checkpointing and self.training:
            for i, block in enumerate(self.trf_blocks):
                if i % self.checkpoint_every == 0:
                    x = checkpoint(block, x, use_reentrant=False, **self.checkpoint_kwargs)
                else:
                    x = block(x)
        else:
            x = self.trf_blocks(x)
        x = self.final_norm(x)
        logits = self.out_head(x)
        return logits

    def hidden_states(self, in_idx):
        """Everything before the output head, for a fused loss (it takes these and out_head.weight). The same ops
        as forward's; written out again, not shared, because forward's locals must live as long as the book's."""
        batch_size, seq_len = in_idx.shape
        tok_embeds = self.tok_emb(in_idx)
        pos_embeds = self.pos_emb(torch.arange(seq_len, device=in_idx.device))
        x = tok_embeds + pos_embeds
        x = self.drop_emb(x)
        if self.gradient_checkpointing and self.training:
            for i, block in enumerate(self.trf_blocks):
                if i % self.checkpoint_every == 0:
                    x = checkpoint(block, x, use_reentrant=False, **self.checkpoint_kwargs)
                else:
                    x = block(x)
        else:
            x = self.trf_blocks(x)
        return self.final_norm(x)


def calc_loss_batch(input_batch, target_batch, model, on_phase: Callable[[str], None]):
    """LLMs-from-scratch ch05: cross-entropy over the flattened logits; `logits` dies on return."""
    logits = model(input_batch)
    on_phase("loss")
    return F.cross_entropy(logits.flatten(0, 1), target_batch.flatten())
