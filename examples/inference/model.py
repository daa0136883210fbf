"""The served model: an MLP trained in seconds on scikit-learn's bundled handwritten digits
(8x8 images, 10 classes), so every answer can be checked against a label.

It is wide on purpose (three 2048-wide layers, about 8.5 M weights): one forward pass reads
34 MB of float32 weights whatever the batch, so a batch of 32 costs far less than 32 batches of
one, as on an accelerator. The int8 variant quantizes its ``Linear`` layers dynamically with
PyTorch's own ``torch.ao.quantization.quantize_dynamic``.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Final, Literal

import numpy as np
import torch
from torch import nn

from examples.inference.data import FEATURES, digits

CLASSES: Final = 10
HIDDEN: Final = 2048
Variant = Literal["float32", "int8"]
VARIANTS: Final[tuple[Variant, ...]] = ("float32", "int8")


def build() -> nn.Module:
    return nn.Sequential(
        nn.Linear(FEATURES, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, CLASSES),
    )


def train(epochs: int = 3, seed: int = 0, log: bool = True) -> nn.Module:
    """A few epochs of Adam: about 97% test accuracy in under a minute of one CPU."""
    torch.manual_seed(seed)
    x, y, _, _ = digits(seed)
    model = build()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-4)
    xs, ys = torch.from_numpy(x), torch.from_numpy(y)
    start = time.perf_counter()
    for epoch in range(epochs):
        order = torch.randperm(len(ys))
        for i in range(0, len(ys), 64):
            batch = order[i : i + 64]
            optimizer.zero_grad()
            torch.autograd.backward(nn.functional.cross_entropy(model(xs[batch]), ys[batch]))
            optimizer.step()
        if log:
            print(f"epoch {epoch + 1}/{epochs} ({time.perf_counter() - start:.1f} s)", flush=True)
    return model.eval()


def load_or_train(path: Path, seed: int = 0) -> nn.Module:
    """The weights at ``path``, trained and saved there first if the file is missing (every
    replica then serves the same model)."""
    model = build()
    if path.exists():
        model.load_state_dict(torch.load(path, weights_only=True))
        return model.eval()
    trained = train(seed=seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    torch.save(trained.state_dict(), partial)
    partial.replace(path)  # replicas starting together never read half a file
    return trained


def variant(model: nn.Module, name: Variant) -> nn.Module:
    """``model`` as served: as is (float32), or with int8 dynamically quantized Linear layers."""
    if name == "float32":
        return model
    if name == "int8":
        with warnings.catch_warnings():
            # PyTorch 2.13 announces on every call that torch.ao.quantization moves to torchao
            # and the quantized tensor types go; the API still works, and is the one asked for.
            warnings.simplefilter("ignore", UserWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            quantized: nn.Module = torch.ao.quantization.quantize_dynamic(  # type: ignore[no-untyped-call]
                model, {nn.Linear}, dtype=torch.qint8
            )
        return quantized.eval()
    raise ValueError(f"unknown variant {name!r}: use one of {', '.join(VARIANTS)}")


def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    with torch.inference_mode():
        predicted = model(torch.from_numpy(x)).argmax(dim=1).numpy()
    return float((predicted == y).mean())


def main() -> None:
    """``python -m examples.inference.model WEIGHTS``: train (once) and report test accuracy."""
    import argparse

    parser = argparse.ArgumentParser(description="Train the served model once, save its weights")
    parser.add_argument("weights", nargs="?", default="digits-mlp.pt")
    args = parser.parse_args()
    trained = load_or_train(Path(args.weights))
    _, _, x_test, y_test = digits()
    for name in VARIANTS:
        score = accuracy(variant(trained, name), x_test, y_test)
        print(f"{name}: test accuracy {score:.4f} on {len(y_test)} digits")
    print(f"weights in {args.weights}")


if __name__ == "__main__":
    main()
