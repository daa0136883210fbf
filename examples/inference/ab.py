"""The A/B verdict on a load generator's run over two variants served side by side::

    python -m examples.inference.loadgen --target http://127.0.0.1:8101 \\
        --target http://127.0.0.1:8102 --rates 60 --step-s 60 --out ab.json
    python -m examples.inference.ab ab.json --a http://127.0.0.1:8101 --b http://127.0.0.1:8102

Requests are assigned to the replica they were sent to (so one that was not served still counts
against its variant); see :func:`examples.inference.stats.ab_verdict` for the tests.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from examples.inference.stats import Record, ab_verdict


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A/B verdict of a load generator's run")
    parser.add_argument("run", help="the load generator's --out file")
    parser.add_argument("--a", required=True, help="variant a's base URL")
    parser.add_argument("--b", required=True, help="variant b's base URL")
    args = parser.parse_args(argv)
    data = json.loads(Path(args.run).read_text())
    records = [Record(**r) for r in data["records"]]
    a = [r for r in records if r.target == args.a]
    b = [r for r in records if r.target == args.b]
    if not a or not b:
        raise SystemExit(f"no requests to {args.a if not a else args.b} in {args.run}")
    names = (
        next((r.variant for r in a if r.variant), "a"),
        next((r.variant for r in b if r.variant), "b"),
    )
    verdict = ab_verdict(a, b, float(data["duration_s"]), names=names)
    print(
        f"{names[0]}: {verdict.throughput[0]:.1f} served/s, P99 {1e3 * verdict.p99_s[0]:.1f} ms, "
        f"accuracy {verdict.accuracy[0]:.4f} ({len(a)} requests)"
    )
    print(
        f"{names[1]}: {verdict.throughput[1]:.1f} served/s, P99 {1e3 * verdict.p99_s[1]:.1f} ms, "
        f"accuracy {verdict.accuracy[1]:.4f} ({len(b)} requests)"
    )
    print(verdict.summary)


if __name__ == "__main__":
    main()
