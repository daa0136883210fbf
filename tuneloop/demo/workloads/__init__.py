"""The training jobs the demo and the tuning-outcome benchmark run: one :class:`Workload` per
job (its data, model, optimizer, metric and target), all run by the same 2-rank DDP job with the
agent (:mod:`tuneloop.demo.job`).

- ``digits``: the demo's small CNN on scikit-learn's bundled 8x8 digits (validation accuracy).
- ``teacher``: a student MLP learning the labels a random teacher MLP gives Gaussian inputs
  (validation accuracy).
- ``shapes``: a small CNN on procedurally drawn 16x16 shapes with pixel noise (validation
  accuracy).
- ``charlm``: a character-level GRU language model on a fixed selection of the Python standard
  library's own source files (validation bits per character, lower is better).

Every data set is made at the start from a seed (or from files that ship with Python): nothing
is downloaded.
"""

from __future__ import annotations

from tuneloop.demo.workloads.spec import Workload


def _registry() -> dict[str, Workload]:
    # Imported here so that naming a workload never costs more than building it.
    from tuneloop.demo.workloads import charlm, digits, shapes, teacher

    every = (digits.WORKLOAD, teacher.WORKLOAD, shapes.WORKLOAD, charlm.WORKLOAD)
    return {w.name: w for w in every}


def names() -> list[str]:
    """Every workload's name, the demo's first."""
    return list(_registry())


def get(name: str) -> Workload:
    """The workload called ``name``; a one-line error naming the choices otherwise."""
    found = _registry().get(name)
    if found is None:
        raise ValueError(f"unknown workload {name!r}: choose one of {', '.join(names())}")
    return found


__all__ = ["Workload", "get", "names"]
