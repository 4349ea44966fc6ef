"""A small causal language model of one's own (token ids in, logits out): no make_batch, so the batch is token
ids (batch, seq) drawn from its nn.Embedding, and the loss cross-entropy over the vocabulary.

    python -m planner simulate whatif --module examples/text_lm.py:make_model --batch-size 8 --seq-len 512 --json
"""
import torch.nn.functional as F
from torch import nn

VOCAB, DIM, HEADS, DEPTH = 211, 64, 4, 2


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.out = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(att.transpose(1, 2).reshape(b, s, DIM))
        return x + self.mlp(self.norm2(x))


class TextLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.Sequential(*[Block() for _ in range(DEPTH)])
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, x):
        return self.head(self.norm(self.blocks(self.emb(x))))


def make_model():
    return TextLM()
