"""A job's config versions and the desired -> released -> observed protocol: the one home.

* :mod:`tuneloop.job_configs.protocol`: what every writer and reader calls (:func:`propose`,
  :func:`release`, :func:`acknowledge`, :func:`report_observed`, :func:`state`, ...).
* :mod:`tuneloop.config_bounds` (in the core, so the pure policy can use it): the one bounds
  check of a desired config.
* :mod:`tuneloop.job_configs.versions`: numbering, raw reads and writes.
* :mod:`tuneloop.job_configs.origins`: who wrote a version (the typed ``origin``, the study
  behind a study's versions, the free-text ``source``).
* :mod:`tuneloop.job_configs.observed`: what an observed version says about the desired ones
  (``acknowledged_version``, ``status``, ``reason``) and the agent's wire keys for them.

The names below are the package's surface; the tuner, the actuators and the API import them
from here.
"""

from tuneloop.config_bounds import Bound, PolicyError, bound_problems, parse_bounds
from tuneloop.job_configs.observed import (
    ACK_KEY,
    FAILED_STATUSES,
    OBSERVED_STATUSES,
    REASON_KEY,
    STATUS_KEY,
    ObservedReport,
    ObservedStatus,
    UnknownVersion,
    split_wire_body,
)
from tuneloop.job_configs.origins import (
    ORIGINS,
    STUDY_ORIGINS,
    STUDY_OUTCOME_SUFFIX,
    STUDY_SOURCE_PREFIX,
    Origin,
    check_origin,
    study_outcome_source,
    study_trial_source,
)
from tuneloop.job_configs.protocol import (
    ACTUATOR_SOURCE,
    ConfigState,
    ReleaseReason,
    acknowledge,
    actuator_row,
    config_marks,
    is_released,
    job_bounds,
    propose,
    release,
    released_config,
    report_observed,
    state,
)
from tuneloop.job_configs.versions import (
    CONFIG_WRITE_ATTEMPTS,
    ConfigKind,
    VersionMismatch,
    append_version,
    config_version,
    first_acknowledgement,
    latest_config,
    runs_config,
)

__all__ = [
    "ACK_KEY",
    "ACTUATOR_SOURCE",
    "CONFIG_WRITE_ATTEMPTS",
    "FAILED_STATUSES",
    "OBSERVED_STATUSES",
    "ORIGINS",
    "REASON_KEY",
    "STATUS_KEY",
    "STUDY_ORIGINS",
    "STUDY_OUTCOME_SUFFIX",
    "STUDY_SOURCE_PREFIX",
    "Bound",
    "ConfigKind",
    "ConfigState",
    "ObservedReport",
    "ObservedStatus",
    "Origin",
    "PolicyError",
    "ReleaseReason",
    "UnknownVersion",
    "VersionMismatch",
    "acknowledge",
    "actuator_row",
    "append_version",
    "bound_problems",
    "check_origin",
    "config_marks",
    "config_version",
    "first_acknowledgement",
    "is_released",
    "job_bounds",
    "latest_config",
    "parse_bounds",
    "propose",
    "release",
    "released_config",
    "report_observed",
    "runs_config",
    "split_wire_body",
    "state",
    "study_outcome_source",
    "study_trial_source",
]
