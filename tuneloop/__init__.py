"""tuneloop: observability and auto-tuning control plane for GPU training and inference fleets.

This package holds what every component shares: configuration (:mod:`tuneloop.settings`), the
storage layer (:mod:`tuneloop.storage`), the CLI (:mod:`tuneloop.cli`) and the job-side agent SDK.
"""

__version__ = "0.1.0"
