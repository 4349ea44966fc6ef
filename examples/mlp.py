"""A tabular MLP with dropout and a label-smoothed loss: make_batch(batch_size) and loss_fn.

    python -m planner simulate train --module examples/mlp.py:make_model --batch-size 256 --json
"""
import torch
from torch import nn

FEATURES, CLASSES = 48, 7


def make_model():
    return nn.Sequential(nn.Linear(FEATURES, 256), nn.GELU(), nn.Dropout(0.1), nn.LayerNorm(256),
                         nn.Linear(256, 256), nn.SiLU(), nn.Linear(256, CLASSES))


def make_batch(batch_size):
    return torch.randn(batch_size, FEATURES), torch.randint(0, CLASSES, (batch_size,))


def loss_fn(output, targets):
    return nn.functional.cross_entropy(output, targets, label_smoothing=0.1)
