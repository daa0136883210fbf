"""A character-level GRU language model on the Python standard library's own source.

The text is a fixed selection of the standard library's top-level modules (``*.py`` directly
under ``sysconfig.get_paths()["stdlib"]``, sorted by name, ``FILES`` of them drawn with the
seed), concatenated and cut to ``CHARACTERS`` characters; non-ASCII characters become ``?``.
Training samples are ``WINDOW``-character windows at seeded random offsets, each labelled with
the same window shifted by one character; the validation windows come from the text's last
tenth, which no training window overlaps. The metric is the validation cross-entropy in bits
per character. The selection depends on the Python version (its standard library): the data
file records the files it read.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import numpy as np
import torch
from torch import nn

from tuneloop.demo.workloads.spec import Workload

VOCABULARY = 128  # ASCII
FILES = 24
CHARACTERS = 400_000
WINDOW = 32
TRAIN_WINDOWS = 6_000
VALIDATION_WINDOWS = 256


def stdlib_text(seed: int) -> tuple[str, list[str]]:
    """The concatenated source of ``FILES`` standard-library modules drawn with ``seed``."""
    root = Path(sysconfig.get_paths()["stdlib"])
    candidates = sorted(p for p in root.glob("*.py") if p.is_file())
    if len(candidates) < FILES:
        raise RuntimeError(f"{root} holds {len(candidates)} modules, fewer than {FILES}")
    picked = sorted(np.random.default_rng(seed).choice(len(candidates), FILES, replace=False))
    chosen = [candidates[int(i)] for i in picked]
    text = "".join(p.read_text(encoding="utf-8", errors="replace") for p in chosen)
    return text[:CHARACTERS], [p.name for p in chosen]


def encode(text: str) -> np.ndarray:
    codes = np.frombuffer(text.encode("ascii", errors="replace"), dtype=np.uint8)
    return codes.astype(np.int64)


def windows(codes: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    index = starts[:, None] + np.arange(WINDOW)[None, :]
    return codes[index], codes[index + 1]


def save_data(path: Path, seed: int = 0) -> None:
    text, files = stdlib_text(seed)
    codes = encode(text)
    split = int(len(codes) * 0.9)
    rng = np.random.default_rng(seed)
    train_starts = rng.integers(0, split - WINDOW - 1, size=TRAIN_WINDOWS)
    val_starts = rng.integers(split, len(codes) - WINDOW - 1, size=VALIDATION_WINDOWS)
    x_train, y_train = windows(codes, train_starts)
    x_val, y_val = windows(codes, val_starts)
    np.savez(
        path, x_train=x_train, y_train=y_train, x_val=x_val, y_val=y_val, files=np.array(files)
    )


class CharGRU(nn.Module):
    """Embedding -> one GRU layer -> per-position logits over the next character."""

    def __init__(self, embedding: int = 32, hidden: int = 128) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCABULARY, embedding)
        self.gru = nn.GRU(embedding, hidden, batch_first=True)
        self.head = nn.Linear(hidden, VOCABULARY)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.gru(self.embed(codes))
        logits: torch.Tensor = self.head(hidden)
        return logits


def build_model() -> nn.Module:
    return CharGRU()


WORKLOAD = Workload(
    name="charlm",
    summary="character-level GRU (83k parameters) on Python standard-library source; "
    "target 3.3 bits/char on held-out text",
    save_data=save_data,
    build_model=build_model,
    metric="bits_per_char",
    target=3.3,
    base_lr=0.003,
    optimizer="adam",
)
