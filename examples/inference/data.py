"""The labelled data: scikit-learn's bundled handwritten digits (8x8 images, 10 classes), split
the same way everywhere, so the load generator's requests carry labels the server never
trained on. No PyTorch here: the load generator imports it."""

from __future__ import annotations

from typing import Final

import numpy as np
from sklearn.datasets import load_digits

FEATURES: Final = 64
TEST_SHARE: Final = 0.25


def digits(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test): pixels scaled to [0, 1], a seeded 75/25 split."""
    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    cut = int(len(y) * (1 - TEST_SHARE))
    train, test = order[:cut], order[cut:]
    return x[train], y[train], x[test], y[test]
