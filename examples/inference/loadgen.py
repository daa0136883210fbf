"""The load generator: open-loop Poisson arrivals at a rate that shifts in steps, each request
a labelled test digit, spread round-robin over the replicas the scaler lists (or fixed URLs).

::

    python -m examples.inference.loadgen --replicas-url http://127.0.0.1:8200/replicas \\
        --rates 40,160,40 --step-s 60 --slo-ms 100 --out run.json

Open loop: a request is sent at its arrival time whether or not earlier ones were answered, as
users do, so an overloaded service shows as latency and refusals, not as a slower generator.
A request not answered with 200 within ``--timeout-s`` is not served. Every 10 s it prints the
window's offered rate, requests served, P99 and replicas; ``--out`` gets every request.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from examples.inference.data import digits
from examples.inference.stats import Record, p99, windows
from examples.inference.wire import Pool, WireError

WINDOW_S = 10.0


def schedule(rates: Sequence[float], step_s: float) -> list[tuple[float, float]]:
    """(start second, requests per second) of each step."""
    if not rates or any(r < 0 or not math.isfinite(r) for r in rates) or step_s <= 0:
        raise ValueError("rates must be non-negative numbers and step_s positive")
    return [(i * step_s, float(rate)) for i, rate in enumerate(rates)]


def arrivals(plan: Sequence[tuple[float, float]], step_s: float, seed: int) -> list[float]:
    """Poisson arrival times (seconds from the start) of the whole run."""
    rng = np.random.default_rng(seed)
    times: list[float] = []
    for start, rate in plan:
        t = start
        while rate > 0:
            t += float(rng.exponential(1 / rate))
            if t >= start + step_s:
                break
            times.append(t)
    return times


class Targets:
    """The replicas to send to: fixed URLs, or the scaler's list re-read every second."""

    def __init__(self, client: httpx.AsyncClient, urls: Sequence[str], replicas_url: str | None):
        if not urls and not replicas_url:
            raise ValueError("give --target URLs or --replicas-url")
        self._client, self._replicas_url = client, replicas_url
        self.urls: list[str] = list(urls)
        self._turn = itertools.count()

    async def refresh(self) -> None:
        if self._replicas_url is None:
            return
        try:
            response = await self._client.get(self._replicas_url, timeout=2)
            self.urls = list(response.json()["urls"])
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            print(f"could not read the replicas from {self._replicas_url}: {exc}", flush=True)

    def next(self) -> str | None:
        return self.urls[next(self._turn) % len(self.urls)] if self.urls else None


async def _send(
    pool: Pool,
    url: str | None,
    pixels: list[float],
    label: int,
    sent_s: float,
    start: float,
    timeout_s: float,
    records: list[Record],
) -> None:
    """One request; its latency counts from its scheduled arrival (``start + sent_s``), so a
    late send is not hidden (no coordinated omission)."""
    served = correct = False
    variant = ""
    if url is not None:
        try:
            status, answer = await pool.post_json(f"{url}/predict", {"pixels": pixels}, timeout_s)
            served = status == 200
            if served:
                correct, variant = answer["label"] == label, answer["variant"]
        except (WireError, TimeoutError):
            pass
    latency = time.monotonic() - start - sent_s
    records.append(Record(sent_s, latency, served, correct, variant, url or ""))


async def run(args: argparse.Namespace) -> list[Record]:
    plan = schedule([float(r) for r in args.rates.split(",")], args.step_s)
    duration = plan[-1][0] + args.step_s
    times = arrivals(plan, args.step_s, args.seed)
    _, _, x_test, y_test = digits()
    pick = np.random.default_rng(args.seed + 1).integers(0, len(y_test), size=len(times))
    records: list[Record] = []
    pool = Pool()
    async with httpx.AsyncClient() as client:
        targets = Targets(client, args.target or [], args.replicas_url)
        await targets.refresh()
        tasks: set[asyncio.Task[None]] = set()
        start = time.monotonic()
        next_refresh, next_report = 1.0, WINDOW_S
        for sent_s, index in zip(times, pick, strict=True):
            now = time.monotonic() - start
            while now >= next_report:  # the window that just ended
                _report(records, next_report, plan, args, len(targets.urls))
                next_report += WINDOW_S
            if now >= next_refresh:
                await targets.refresh()
                next_refresh = now + 1.0
            if sent_s > now:
                await asyncio.sleep(sent_s - now)
            task = asyncio.create_task(
                _send(
                    pool, targets.next(), x_test[index].tolist(), int(y_test[index]), sent_s,
                    start, args.timeout_s, records,
                )
            )  # fmt: skip
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(tasks)
        pool.close()
    _report(records, duration, plan, args, len(targets.urls))
    return records


def _report(
    records: Sequence[Record],
    end_s: float,
    plan: Sequence[tuple[float, float]],
    args: argparse.Namespace,
    replicas: int,
) -> None:
    window = [r for r in records if end_s - WINDOW_S <= r.sent_s < end_s]
    rate = next((r for s, r in reversed(plan) if s <= end_s - WINDOW_S), 0.0)
    served = [r.latency_s for r in window if r.served]
    print(
        f"t={end_s:5.0f}s offered {rate:5.0f}/s sent {len(window):5d} served {len(served):5d} "
        f"p99 {1e3 * p99(served):7.1f} ms replicas {replicas}",
        flush=True,
    )


def summary(records: Sequence[Record], duration_s: float, slo_s: float) -> dict[str, Any]:
    found = windows(records, WINDOW_S, duration_s)
    busy = [w for w in found if w.sent]
    return {
        "sent": len(records),
        "served": sum(r.served for r in records),
        "correct": sum(r.correct for r in records),
        "windows": len(busy),
        "windows_within_slo": sum(w.within(slo_s) for w in busy),
        "p99_s": p99([r.latency_s if r.served else math.inf for r in records]),
    }


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--target", action="append", help="a replica's base URL (repeatable)")
    parser.add_argument("--replicas-url", help="the scaler's /replicas, re-read every second")
    parser.add_argument("--rates", default="40,160,40", help="requests/s of each step")
    parser.add_argument("--step-s", type=float, default=60.0, help="seconds of each step")
    parser.add_argument("--slo-ms", type=float, default=100.0)
    parser.add_argument("--timeout-s", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the summary and every request here (JSON)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    records = asyncio.run(run(args))
    duration = len(args.rates.split(",")) * args.step_s
    result = summary(records, duration, args.slo_ms / 1000)
    print(json.dumps(result), flush=True)
    if args.out:
        payload = {**result, "duration_s": duration, "records": [asdict(r) for r in records]}
        Path(args.out).write_text(json.dumps(payload))


if __name__ == "__main__":
    main()
