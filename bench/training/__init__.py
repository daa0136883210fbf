"""Real training runs measured to build the tuner's benchmark problems (``bench/tuning.py``).

``ddp_job`` is a 2-process PyTorch DistributedDataParallel job on the CPU (gloo) that trains a
small CNN on scikit-learn's bundled ``load_digits`` data set and measures, per run, throughput,
the phases of a step, the gradient noise scale and the wall-clock time to a target validation
accuracy. ``measure`` runs it over a grid of per-rank batch size x sync period under several
conditions and writes ``bench/data/ddp_digits_<condition>.json``.

Needs torch (``pip install -e '.[demo]'``). Nothing in ``tuneloop/`` or ``tests/`` imports this
package: it is a benchmark asset, run by hand (see ``bench/data/README.md``).
"""
