"""A job's config versions and the desired -> released -> observed protocol: the one home.

* :mod:`tuneloop.job_configs.protocol`: what every writer and reader calls (:func:`propose`,
  :func:`release`, :func:`acknowledge`, :func:`report_observed`, :func:`state`, ...).
* :mod:`tuneloop.config_bounds` (in the core, so the pure policy can use it): the one bounds
  check of a desired config.
* :mod:`tuneloop.job_configs.versions`: numbering, raw reads and writes, the keys an observed
  config carries and the sources of a study's versions.

The names below are the package's surface; the tuner, the actuators and the API import them
from here.
"""

from tuneloop.config_bounds import Bound, PolicyError, bound_problems, parse_bounds
from tuneloop.job_configs.protocol import (
    ACTUATOR_SOURCE,
    ConfigState,
    ReleaseReason,
    UnknownVersion,
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
    ACK_KEY,
    CONFIG_WRITE_ATTEMPTS,
    FAILED_STATUSES,
    REASON_KEY,
    STATUS_KEY,
    STUDY_OUTCOME_SUFFIX,
    STUDY_SOURCE_PREFIX,
    ConfigKind,
    acknowledged_version,
    append_version,
    config_version,
    first_acknowledgement,
    is_study_outcome,
    is_study_trial,
    latest_config,
    runs_config,
    study_outcome_source,
    study_trial_source,
)

__all__ = [
    "ACK_KEY",
    "ACTUATOR_SOURCE",
    "CONFIG_WRITE_ATTEMPTS",
    "FAILED_STATUSES",
    "REASON_KEY",
    "STATUS_KEY",
    "STUDY_OUTCOME_SUFFIX",
    "STUDY_SOURCE_PREFIX",
    "Bound",
    "ConfigKind",
    "ConfigState",
    "PolicyError",
    "ReleaseReason",
    "UnknownVersion",
    "acknowledge",
    "acknowledged_version",
    "actuator_row",
    "append_version",
    "bound_problems",
    "config_marks",
    "config_version",
    "first_acknowledgement",
    "is_released",
    "is_study_outcome",
    "is_study_trial",
    "job_bounds",
    "latest_config",
    "parse_bounds",
    "propose",
    "release",
    "released_config",
    "report_observed",
    "runs_config",
    "state",
    "study_outcome_source",
    "study_trial_source",
]
