"""``tuneloop demo``: the control plane on the embedded default tunes a real 2-process PyTorch
DistributedDataParallel job live, then measures the tuned config against the starting one and
a hand-picked default (``docs/demo.md``). Needs the ``demo`` extra (PyTorch)."""
