"""Teacher-student: a random teacher MLP labels Gaussian inputs; a wider student learns it.

The teacher (16 -> 32 -> 5, tanh, weights drawn with a fixed seed) gives each of 50,000
standard-normal inputs the class of its largest logit; the student (16 -> 128 -> 128 -> 5,
ReLU) sees only the inputs and labels of 48,000 of them. The class boundaries are curved, so the
student needs tens of thousands of samples to reach the target (it passes 84% quickly, then
climbs slowly towards 89%): a cheap model whose step time is mostly fixed costs (input latency,
synchronization), unlike the CNNs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from tuneloop.demo.workloads.spec import Workload, save_split

INPUTS = 16
CLASSES = 5
SAMPLES = 50_000
VALIDATION = 2_000


def teacher_labels(x: torch.Tensor, seed: int) -> torch.Tensor:
    """The labels of a random two-layer tanh teacher drawn with ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(INPUTS, 32, generator=generator) / INPUTS**0.5
    out = torch.randn(32, CLASSES, generator=generator) / 32**0.5
    labels: torch.Tensor = (torch.tanh(x @ hidden) @ out).argmax(dim=1)
    return labels


def save_data(path: Path, seed: int = 0) -> None:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(SAMPLES, INPUTS, generator=generator)
    y = teacher_labels(x, seed + 1)
    save_split(path, x.numpy().astype(np.float32), y.numpy().astype(np.int64), VALIDATION, seed)


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(INPUTS, 128),
        nn.ReLU(),
        nn.Linear(128, 128),
        nn.ReLU(),
        nn.Linear(128, CLASSES),
    )


WORKLOAD = Workload(
    name="teacher",
    summary="student MLP (19k parameters) learning a random teacher MLP's labels of Gaussian "
    "inputs; target 87.5% accuracy",
    save_data=save_data,
    build_model=build_model,
    metric="accuracy",
    target=0.875,
    time_budget_s=60.0,
    eval_every_samples=1024,
)
