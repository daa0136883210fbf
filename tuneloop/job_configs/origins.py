"""Who wrote a config version: its typed ``origin``, the study behind a study's versions, and
the free-text ``source`` people read in the audit trail.

Code decides by ``JobConfig.origin`` (and ``origin_study_id``), never by parsing ``source``:
the API's callers choose ``source`` freely, so it could not tell a study's trial from a
person's change.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

Origin = Literal["api", "agent", "tuner-trial", "study-outcome", "actuator"]
"""* ``api``: written through the HTTP API (a person or a script with a member token);
* ``agent``: the job's agent (its starting config at registration, its acks and reports);
* ``tuner-trial``: a tuning study's trial: exploration, released without verification and
  never the last good version;
* ``study-outcome``: the one config a study writes when it ends (the pre-study config it
  restores, or the best one after it beat the pre-study one by more than the noise); measured
  as good, so the actuator releases it as the job's last good version;
* ``actuator``: the actuator's own steps, rollbacks and copies of a goal (reserved)."""

ORIGINS: Final[tuple[Origin, ...]] = get_args(Origin)
STUDY_ORIGINS: Final[tuple[Origin, ...]] = ("tuner-trial", "study-outcome")
"""The origins a study writes; only these carry ``origin_study_id``."""

STUDY_SOURCE_PREFIX: Final = "tuner:study:"
"""Starts the ``source`` text of a study's versions (then the study's id)."""
STUDY_OUTCOME_SUFFIX: Final = ":outcome"
"""Ends the ``source`` text of a study's outcome."""


def study_trial_source(study_id: int) -> str:
    """``JobConfig.source`` of a study's trial configs, for people to read."""
    return f"{STUDY_SOURCE_PREFIX}{study_id}"


def study_outcome_source(study_id: int) -> str:
    """``JobConfig.source`` of the config a study leaves the job on when it ends."""
    return f"{STUDY_SOURCE_PREFIX}{study_id}{STUDY_OUTCOME_SUFFIX}"


def check_origin(origin: str, study_id: int | None) -> Origin:
    """``origin`` as an :data:`Origin`; :class:`ValueError` for an unknown one, or a study
    named on a version no study wrote (a programming error, not input)."""
    if origin not in ORIGINS:
        raise ValueError(f"unknown config origin {origin!r}; known: {', '.join(ORIGINS)}")
    if study_id is not None and origin not in STUDY_ORIGINS:
        raise ValueError(f"origin {origin!r} names no study, got study {study_id}")
    return origin


def default_source(origin: Origin, study_id: int | None) -> str:
    """The ``source`` text of a version whose writer gave none."""
    if study_id is not None and origin == "tuner-trial":
        return study_trial_source(study_id)
    if study_id is not None and origin == "study-outcome":
        return study_outcome_source(study_id)
    return origin
