"""A small CNN classifier with BatchNorm: a model without a sequence axis.

    python -m planner simulate train --module examples/cnn.py:make_model --input-shape 3x32x32 --batch-size 64 --json
    python -m planner measure  train --module examples/cnn.py:make_model --input-shape 3x32x32 --batch-size 64 --device cpu
    python -m planner estimate train --module examples/cnn.py:make_model --input-shape 3x32x32 --batch-size 64

With --input-shape the inputs are randn(batch, 3, 32, 32) and the targets class ids of the output's last dimension
(10 here); the default loss is cross-entropy.
"""
from torch import nn


def make_model():
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
