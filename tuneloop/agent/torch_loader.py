"""The data loader's knobs: ``num_workers`` and ``prefetch_factor`` of a
``torch.utils.data.DataLoader``, declared as ``loader_workers`` and ``prefetch_factor`` and
applied at a step boundary by rebuilding the loader and its iterator.

::

    loader = LoaderSettings(num_workers=2, prefetch_factor=2)

    def make_loader(batch_size):
        return DataLoader(dataset, batch_size=batch_size, shuffle=True, **loader.kwargs())

    training = TunedTraining(agent, model, optimizer, make_loader, config=...,
                             knobs=loader.knobs(workers=(0, 8), prefetch=(1, 8)))

A new value takes effect from the next step on every rank: the old iterator's workers are shut
down and a new pass of the loader starts (with a shuffling sampler, a new permutation, as at
the end of a pass).
"""

from __future__ import annotations

from typing import Any

from tuneloop.agent.knobs import LOADER_WORKERS, PREFETCH_FACTOR, Knob, KnobError

DEFAULT_PREFETCH = 2
"""PyTorch's own default ``prefetch_factor`` with workers."""


class LoaderSettings:
    """The loader construction settings the knobs change; ``make_loader`` reads
    :meth:`kwargs` each time it builds a loader."""

    def __init__(self, num_workers: int = 0, prefetch_factor: int = DEFAULT_PREFETCH) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise KnobError(f"num_workers must be >= 0, got {num_workers!r}")
        if not isinstance(prefetch_factor, int) or prefetch_factor < 1:
            raise KnobError(f"prefetch_factor must be >= 1, got {prefetch_factor!r}")
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor

    def kwargs(self) -> dict[str, Any]:
        """``DataLoader`` keyword arguments: ``prefetch_factor`` only with workers (PyTorch
        refuses it without); workers persist across passes, so a pass does not pay their
        start-up again."""
        if self.num_workers == 0:
            return {"num_workers": 0}
        return {
            "num_workers": self.num_workers,
            "prefetch_factor": self.prefetch_factor,
            "persistent_workers": True,
        }

    def _set_workers(self, value: int) -> None:
        self.num_workers = value

    def _set_prefetch(self, value: int) -> None:
        self.prefetch_factor = value

    def knobs(
        self, workers: tuple[int, int] = (0, 8), prefetch: tuple[int, int] | None = (1, 8)
    ) -> list[Knob]:
        """``loader_workers`` over ``workers`` and (unless ``None``) ``prefetch_factor`` over
        ``prefetch``, both rebuilding the loader; the defaults are the current settings."""
        knobs = [
            Knob.integer(
                LOADER_WORKERS,
                *workers,
                default=self.num_workers,
                apply=self._set_workers,
                reload=True,
            )
        ]
        if prefetch is not None:
            knobs.append(
                Knob.integer(
                    PREFETCH_FACTOR,
                    *prefetch,
                    default=self.prefetch_factor,
                    apply=self._set_prefetch,
                    reload=True,
                )
            )
        return knobs
