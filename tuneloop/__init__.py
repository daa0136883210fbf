"""tuneloop: observability and auto-tuning control plane for GPU training and inference fleets.

This package holds what every component shares: configuration (:mod:`tuneloop.settings`), the
storage layer (:mod:`tuneloop.storage`), the CLI (:mod:`tuneloop.cli`) and the job-side agent SDK
(:mod:`tuneloop.agent`). Two distributions install it: ``tuneloop-agent`` (``agent/``) ships this
file, :mod:`tuneloop.agent` and :mod:`tuneloop.learning_rate`; ``tuneloop``, the server, the rest.
"""

import pkgutil

__version__ = "0.1.0"

# With one half installed from a wheel and the other from a checkout in development mode, the
# package lives in two directories: look for its modules in both.
__path__ = pkgutil.extend_path(__path__, __name__)
