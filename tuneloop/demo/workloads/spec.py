"""What a training job is to the demo's DDP harness: data, model, optimizer, metric, target."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import nn

Metric = Literal["accuracy", "bits_per_char"]


@dataclass(frozen=True)
class Workload:
    """One training job.

    ``save_data(path, seed)`` writes ``x_train``, ``y_train``, ``x_val``, ``y_val`` to an
    ``.npz`` file (the ranks read their shards from it); ``build_model()`` returns the model,
    whose output is class logits ``(batch, classes)`` or, for a sequence model, per-position
    logits ``(batch, positions, classes)``. The learning rate is ``base_lr`` at the global batch
    ``base_batch``, scaled by ``lr_scaling`` for other effective batches (as the agent's
    ``TunedTraining`` does).
    """

    name: str
    summary: str
    save_data: Callable[[Path, int], None]
    build_model: Callable[[], nn.Module]
    metric: Metric
    target: float
    """The metric's value that ends a run: at least this accuracy, at most these bits/char."""
    base_lr: float = 0.05
    base_batch: int = 32
    lr_scaling: Literal["sqrt", "linear"] = "sqrt"
    optimizer: Literal["sgd", "adam"] = "sgd"
    time_budget_s: float = 30.0
    eval_every_samples: int = 512

    @property
    def higher_is_better(self) -> bool:
        return self.metric == "accuracy"

    def reached(self, score: float) -> bool:
        """Whether ``score`` meets the target."""
        return score >= self.target if self.higher_is_better else score <= self.target

    def make_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        if self.optimizer == "adam":
            return torch.optim.Adam(model.parameters(), lr=self.base_lr)
        return torch.optim.SGD(model.parameters(), lr=self.base_lr, momentum=0.9)

    def fmt_score(self, score: float) -> str:
        if self.metric == "accuracy":
            return f"{score:.1%} accuracy"
        return f"{score:.3f} bits/char"


def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the samples, or over every position of a sequence model."""
    return nn.functional.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))


def score_sums(
    workload: Workload, model: nn.Module, x: torch.Tensor, y: torch.Tensor
) -> tuple[float, float]:
    """This rank's share of the metric as (sum, count), to be summed over the ranks: correct
    predictions and samples, or negative log-likelihood in bits and characters."""
    with torch.no_grad():
        output = model(x)
        flat, labels = output.reshape(-1, output.shape[-1]), y.reshape(-1)
        if workload.metric == "accuracy":
            return float((flat.argmax(dim=1) == labels).sum()), float(len(labels))
        nll = nn.functional.cross_entropy(flat, labels, reduction="sum")
        return float(nll) / math.log(2), float(len(labels))


def split_indices(samples: int, validation: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A fixed split (``seed``): the indices of ``validation`` held-out samples and the rest."""
    order = np.random.default_rng(seed).permutation(samples)
    return order[:validation], order[validation:]


def save_split(path: Path, x: np.ndarray, y: np.ndarray, validation: int, seed: int) -> None:
    """The split of :func:`split_indices`, written as the ``.npz`` the ranks read."""
    val, train = split_indices(len(y), validation, seed)
    np.savez(path, x_train=x[train], y_train=y[train], x_val=x[val], y_val=y[val])
