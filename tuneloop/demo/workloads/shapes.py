"""A small CNN on procedurally drawn shapes: 16x16 grey images of six kinds of glyph (horizontal
bar, vertical bar, square outline, filled square, cross, diagonal), at random positions and
sizes, with random brightness and Gaussian pixel noise, drawn with numpy from a seed.

Like a crowd-labelled image set, 40% of the training labels are replaced by a random class
(``LABEL_NOISE``); the validation labels are clean. The noisy labels make the gradient noisy
(a large gradient noise scale), so larger batches lose little per sample here, unlike on the
character model: the benchmark's jobs differ in where their best batch lies."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from torch import nn

from tuneloop.demo.workloads.spec import Workload, save_split, split_indices

SIDE = 16
CLASSES = 6
SAMPLES = 20_000
VALIDATION = 1_000
NOISE = 0.3
LABEL_NOISE = 0.4


def draw(kind: int, rng: np.random.Generator) -> np.ndarray:
    """One glyph of ``kind`` at a random place and size, before noise."""
    image = np.zeros((SIDE, SIDE), dtype=np.float32)
    size = int(rng.integers(5, 11))
    top, left = (int(v) for v in rng.integers(0, SIDE - size + 1, size=2))
    rows, cols = slice(top, top + size), slice(left, left + size)
    middle_row, middle_col = top + size // 2, left + size // 2
    if kind == 0:  # horizontal bar
        image[middle_row - 1 : middle_row + 1, cols] = 1
    elif kind == 1:  # vertical bar
        image[rows, middle_col - 1 : middle_col + 1] = 1
    elif kind == 2:  # square outline
        image[rows, cols] = 1
        image[top + 1 : top + size - 1, left + 1 : left + size - 1] = 0
    elif kind == 3:  # filled square
        image[rows, cols] = 1
    elif kind == 4:  # cross
        image[middle_row, cols] = 1
        image[rows, middle_col] = 1
    else:  # diagonal
        for offset in range(size):
            image[top + offset, left + offset] = 1
    return image * float(rng.uniform(0.6, 1.0))


def save_data(path: Path, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, CLASSES, size=SAMPLES).astype(np.int64)
    clean = np.stack([draw(int(kind), rng) for kind in y])
    x = clean + rng.normal(0.0, NOISE, size=clean.shape).astype(np.float32)
    held_out, _ = split_indices(SAMPLES, VALIDATION, seed)
    labels = noisy_labels(y, held_out, rng)
    save_split(path, x.reshape(-1, 1, SIDE, SIDE).astype(np.float32), labels, VALIDATION, seed)


def noisy_labels(y: np.ndarray, held_out: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``y`` with each label outside ``held_out`` replaced by a random class with probability
    ``LABEL_NOISE`` (a random class may be the true one); the held-out labels stay true, so
    the metric is clean accuracy."""
    relabelled = rng.random(len(y)) < LABEL_NOISE
    relabelled[held_out] = False
    labels = y.copy()
    labels[relabelled] = rng.integers(0, CLASSES, size=int(relabelled.sum()))
    return labels


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * 4 * 4, 32),
        nn.ReLU(),
        nn.Linear(32, CLASSES),
    )


WORKLOAD = Workload(
    name="shapes",
    summary="two-layer CNN (10k parameters) on generated 16x16 noisy shapes, 6 kinds, 40% of "
    "training labels random; target 92% accuracy",
    save_data=save_data,
    build_model=build_model,
    metric="accuracy",
    target=0.92,
    time_budget_s=60.0,
)
