"""The demo's job: a small CNN on scikit-learn's bundled digits (1,797 8x8 images, 10 classes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from torch import nn

from tuneloop.demo.workloads.spec import Workload, save_split


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * 4 * 4, 64),
        nn.ReLU(),
        nn.Linear(64, 10),
    )


def save_digits(path: Path, seed: int = 0, *, validation: int = 360) -> None:
    """scikit-learn's bundled digits (no download) as ``.npz``: pixels / 16, a fixed split
    (``seed``) of ``validation`` held-out images and the rest for training."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    save_split(path, x, digits.target.astype(np.int64), validation, seed)


WORKLOAD = Workload(
    name="digits",
    summary="small CNN (17k parameters) on scikit-learn's 8x8 digits; target 97% accuracy",
    save_data=save_digits,
    build_model=build_model,
    metric="accuracy",
    target=0.97,
)
