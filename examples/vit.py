"""A ViT-like image model (patch embedding, pre-norm transformer blocks, a class token): make_batch(batch_size)
with one argument says it has no sequence axis (the number of patches is fixed by the image size).

    python -m planner simulate train --module examples/vit.py:make_model --batch-size 32 --json
"""
import torch
from torch import nn

IMAGE, PATCH, DIM, HEADS, DEPTH, CLASSES = 32, 8, 64, 4, 2, 10


class ViT(nn.Module):
    def __init__(self):
        super().__init__()
        self.patch = nn.Conv2d(3, DIM, PATCH, stride=PATCH)
        self.cls = nn.Parameter(torch.zeros(1, 1, DIM))
        self.pos = nn.Parameter(torch.zeros(1, 1 + (IMAGE // PATCH) ** 2, DIM))
        layer = nn.TransformerEncoderLayer(DIM, HEADS, 4 * DIM, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, DEPTH, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        return self.head(self.norm(self.blocks(x))[:, 0])


def make_model():
    return ViT()


def make_batch(batch_size):
    return torch.randn(batch_size, 3, IMAGE, IMAGE), torch.randint(0, CLASSES, (batch_size,))
