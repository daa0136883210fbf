"""The inference example under a shifting load: tuneloop's study and autoscaler against the best
fixed batching config chosen beforehand, then the A/B of float32 against int8.

Everything runs as a user runs it (examples/inference/README.md): real server replicas behind
the scaler (the autoscaler's webhook target), the open-loop load generator, ``tuneloop up``.

1. **Sweep** (chooses the fixed contender before any comparison): one float32 replica, no
   control plane; each (max_batch_size, max_delay_ms) of a 3 x 3 grid serves the schedule's
   mean rate for ``--sweep-s``. The best: P99 within the SLO first, then serving at least 99%
   of what the best-serving config served (below saturation they all serve the offered load),
   then the lowest P99.
2. **Runs**, ``--repeats`` times, the two contenders interleaved (their order alternates), each
   on the same schedule (``--rates`` for ``--step-s`` each) and the same seeded arrivals:
   *fixed*: one replica running the sweep's best config, registered with its agent (observed
   as the tuned one is, so both pay the same telemetry; no study, no autoscaler); *tuneloop*:
   one replica starting from the server's default (8, 5 ms), registered with its agent, a
   fresh ``offered_load_p99`` study of both knobs (Bayesian; the lowest P99 at the offered
   load, one incumbent per load band) and an autoscaler (1 to ``--max-replicas``, on the P99
   and the queue). Each run gives the share of 10 s windows whose P99 met the SLO (a request not
   served counts as a miss), requests served, and mean replicas; the table gives means with
   95% bootstrap intervals over the repeats and the paired differences.
3. **A/B**: a float32 and an int8 replica side by side at the sweep's best config, the load
   generator alternating between them at ``--ab-rate``: ``examples.inference.stats.ab_verdict``.

::

    .venv/bin/python bench/inference_study.py --repeats 3 --out bench/data/inference_study.json
    .venv/bin/python bench/inference_study.py --quick     # one short repeat, to see it work
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx

from examples.inference import model as models
from examples.inference.stats import Record, ab_verdict, bootstrap_mean, slo_share, windows
from tuneloop.demo.processes import PROJECT, ControlPlane, control_plane
from tuneloop.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
WINDOW_S = 10.0
SWEEP = [(b, d) for b in (2, 8, 32) for d in (2, 10, 40)]
START = {"max_batch_size": 8, "max_delay_ms": 5}


def say(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


def spawn(
    args: Sequence[str], log: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    full = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", *args], cwd=ROOT, env=full, stdout=out, stderr=subprocess.STDOUT
        )


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_until(probe: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if probe():
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.5)


@contextmanager
def replica(weights: Path, workdir: Path, name: str, variant: str = "float32") -> Iterator[str]:
    """One server process without a control plane; its base URL."""
    port = free_port()
    args = ["examples.inference.server", "--port", str(port), "--weights", str(weights)]
    process = spawn([*args, "--variant", variant, "--replica", name], workdir / f"{name}.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: httpx.get(f"{url}/healthz", timeout=2).is_success, 120, name)
        yield url
    finally:
        stop(process)


@contextmanager
def scaler(
    weights: Path, workdir: Path, knobs: Mapping[str, int], env: Mapping[str, str]
) -> Iterator[str]:
    """The scaler with one replica running ``knobs``; its base URL once the replica answers."""
    port = free_port()
    server = ["--weights", str(weights)]
    server += ["--max-batch-size", str(knobs["max_batch_size"])]
    server += ["--max-delay-ms", str(knobs["max_delay_ms"])]
    args = ["examples.inference.scaler", "--port", str(port), "--log-dir", str(workdir), "--"]
    process = spawn([*args, *server], workdir / "scaler.log", env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: bool(httpx.get(f"{url}/replicas", timeout=2).json()["urls"]), 120, "r0")
        yield url
    finally:
        stop(process)


def load(
    workdir: Path, name: str, plan: argparse.Namespace, *, rates: str, step_s: float,
    targets: Sequence[str] = (), replicas_url: str | None = None,
    during: Callable[[], None] | None = None,
) -> list[Record]:  # fmt: skip
    """Run the load generator to the end (calling ``during`` every 2 s); its records."""
    out = workdir / f"{name}.json"
    args = ["examples.inference.loadgen", "--rates", rates, "--step-s", str(step_s)]
    args += ["--slo-ms", str(plan.slo_ms), "--seed", str(plan.seed), "--out", str(out)]
    args += [a for t in targets for a in ("--target", t)]
    args += ["--replicas-url", replicas_url] if replicas_url else []
    process = spawn(args, workdir / f"{name}.log")
    while process.poll() is None:
        if during is not None:
            during()
        time.sleep(2)
    if process.returncode:
        raise RuntimeError(f"the load generator failed; see {workdir / name}.log")
    return [Record(**r) for r in json.loads(out.read_text())["records"]]


def mean_rate(rates: str) -> float:
    values = [float(r) for r in rates.split(",")]
    return sum(values) / len(values)


def summarize(records: Sequence[Record], duration_s: float, slo_s: float) -> dict[str, Any]:
    found = windows(records, WINDOW_S, duration_s)
    served = [r for r in records if r.served]
    return {
        "sent": len(records),
        "served": len(served),
        "within_slo": slo_share(found, slo_s),
        "accuracy": sum(r.correct for r in served) / len(served) if served else None,
    }


def sweep(plan: argparse.Namespace, weights: Path, workdir: Path) -> dict[str, int]:
    rate = mean_rate(plan.rates)
    rows = []
    with replica(weights, workdir, "sweep") as url:
        for batch, delay in SWEEP:
            knobs = {"max_batch_size": batch, "max_delay_ms": delay}
            httpx.put(f"{url}/knobs", json=knobs, timeout=10).raise_for_status()
            records = load(
                workdir, f"sweep-{batch}-{delay}", plan, rates=f"{rate:g}",
                step_s=plan.sweep_s, targets=[url],
            )  # fmt: skip
            lat = sorted(r.latency_s if r.served else float("inf") for r in records)
            p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else float("inf")
            served = sum(r.served for r in records)
            rows.append((knobs, served, p99))
            say(
                f"sweep {batch} x {delay} ms at {rate:g}/s: {served} served, P99 {1e3 * p99:.0f} ms"
            )
    most = max(row[1] for row in rows)
    best = max(rows, key=lambda row: (row[2] <= plan.slo_ms / 1000, row[1] >= 0.99 * most, -row[2]))
    say(f"fixed contender: {best[0]} (served {best[1]}, P99 {1e3 * best[2]:.0f} ms)")
    return best[0]


def replicas_probe(url: str, seen: list[int]) -> Callable[[], None]:
    def probe() -> None:
        with suppress(httpx.HTTPError):
            seen.append(int(httpx.get(f"{url}/scale", timeout=2).json()["replicas"]))

    return probe


def observed_job(plane: ControlPlane, job: str) -> dict[str, str]:
    """Register ``job`` with the control plane; the environment under which a replica's agent
    reports to it (its step timings, latency histogram and queue over OTLP)."""
    created = plane.client().post(
        f"{plane.url}/api/v1/projects/{PROJECT}/jobs", json={"name": job, "kind": "inference"}
    )
    created.raise_for_status()
    return {
        "TUNELOOP_URL": plane.url,
        "TUNELOOP_TOKEN": plane.agent_token,
        "TUNELOOP_JOB": job,
        "TUNELOOP_PROJECT": PROJECT,
    }


def fixed_run(
    plan: argparse.Namespace, plane: ControlPlane, weights: Path, workdir: Path,
    knobs: Mapping[str, int], job: str,
) -> dict[str, Any]:  # fmt: skip
    """One replica on ``knobs``, observed by the control plane as the tuned one is (its agent
    and telemetry cost the same CPU), with no study and no autoscaler."""
    seen: list[int] = []
    with scaler(weights, workdir, knobs, observed_job(plane, job)) as url:
        records = load(
            workdir, "load", plan, rates=plan.rates, step_s=plan.step_s,
            replicas_url=f"{url}/replicas", during=replicas_probe(url, seen),
        )  # fmt: skip
    return {**summarize(records, plan.duration_s, plan.slo_ms / 1000), "replicas": _mean(seen)}


def tuned_run(
    plan: argparse.Namespace, plane: ControlPlane, admin: str, weights: Path, workdir: Path,
    job: str,
) -> dict[str, Any]:  # fmt: skip
    member = plane.client()
    admin_client = httpx.Client(headers={"Authorization": f"Bearer {admin}"}, timeout=30)
    base = f"{plane.url}/api/v1/projects/{PROJECT}"
    env = observed_job(plane, job)
    seen: list[int] = []
    made: dict[str, Any] = {}
    with scaler(weights, workdir, START, env) as url:
        probe = replicas_probe(url, seen)

        def during() -> None:
            probe()
            if "study" not in made:
                answer = member.post(f"{base}/jobs/{job}/studies", json=study_body(plan))
                if answer.status_code == 201:  # 409/422 until the first step timings are in
                    made["study"] = answer.json()["id"]
                    say(f"study {made['study']} created")
            if "study" in made and "autoscaler" not in made:
                body = autoscaler_body(plan, job, f"{url}/scale")
                answer = admin_client.post(f"{base}/autoscalers", json=body)
                answer.raise_for_status()
                made["autoscaler"] = job

        records = load(
            workdir, "load", plan, rates=plan.rates, step_s=plan.step_s,
            replicas_url=f"{url}/replicas", during=during,
        )  # fmt: skip
        if "autoscaler" in made:
            admin_client.delete(f"{base}/autoscalers/{job}")
        trials = []
        if "study" in made:
            study_url = f"{base}/jobs/{job}/studies/{made['study']}"
            trials = member.get(f"{study_url}/trials").json()["items"]
            member.delete(study_url)
    summary = summarize(records, plan.duration_s, plan.slo_ms / 1000)
    told = [(t["params"], t["state"], t["value"]) for t in trials]
    return {**summary, "replicas": _mean(seen), "trials": told}


def study_body(plan: argparse.Namespace) -> dict[str, Any]:
    """Both knobs the replica declares, over their declared ranges (examples/inference)."""
    return {
        "name": "batching",
        "objective": "offered_load_p99",
        "slo_s": plan.slo_ms / 1000,
        "strategy": "bayesian",
        "seed": plan.seed,
        "space": {"knobs": list(START)},
        "measurement": {"warmup_s": 3, "window_s": 10, "min_samples": 5, "max_rel_stderr": 0.1},
        "ack_timeout_s": 30,
        "warm_start": False,
    }


def autoscaler_body(plan: argparse.Namespace, job: str, url: str) -> dict[str, Any]:
    buckets = f'tuneloop_request_duration_seconds_bucket{{job="{job}"}}'
    return {
        "name": job,
        "target_kind": "webhook",
        "target": {"url": url},
        "policy": {
            "min_replicas": 1,
            "max_replicas": plan.max_replicas,
            "p99_slo_s": plan.slo_ms / 1000,
            "target_queue_per_replica": 16,
            # One replica at a time: a starting replica (PyTorch, the weights) takes a core
            # for seconds, which a busy two-core host feels.
            "scale_out_pods": 1,
            "period_s": 10,
            "scale_in_stabilization_s": 30,
            "queue_lookahead_s": 10,
            "max_metric_age_s": 15,
        },
        "p99": {"expr": f"histogram_quantile(0.99, sum by (le) (rate({buckets}[20s])))"},
        "queue": {"expr": f'sum(inference_queue_depth{{job="{job}"}})'},
    }


def ab(plan: argparse.Namespace, weights: Path, workdir: Path, knobs: Mapping[str, int]) -> Any:
    with (
        replica(weights, workdir, "ab-float32", "float32") as f32,
        replica(weights, workdir, "ab-int8", "int8") as int8,
    ):
        for url in (f32, int8):
            httpx.put(f"{url}/knobs", json=dict(knobs), timeout=10).raise_for_status()
        records = load(
            workdir, "ab", plan, rates=f"{plan.ab_rate:g}", step_s=plan.ab_s, targets=[f32, int8]
        )
    a = [r for r in records if r.target == f32]
    b = [r for r in records if r.target == int8]
    return ab_verdict(a, b, plan.ab_s, names=("float32", "int8"), seed=plan.seed)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def admin_token(workdir: Path) -> str:
    env = {**os.environ, "TUNELOOP_DATA_DIR": str(workdir / "store")}
    out = subprocess.run(
        [sys.executable, "-m", "tuneloop", "token", "create", "--role", "admin"],
        env=env, check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    return out.strip()


def report(results: Mapping[str, list[dict[str, Any]]], plan: argparse.Namespace) -> list[str]:
    lines = [
        "| contender | within SLO (share of 10 s windows) | requests served | mean replicas |",
        "|---|---:|---:|---:|",
    ]
    for name, runs in results.items():
        share = bootstrap_mean([r["within_slo"] for r in runs], plan.seed)
        served = bootstrap_mean([r["served"] for r in runs], plan.seed)
        reps = [r["replicas"] for r in runs if r["replicas"] is not None]
        lines.append(
            f"| {name} | {share[0]:.2f} [{share[1]:.2f}, {share[2]:.2f}] "
            f"| {served[0]:.0f} [{served[1]:.0f}, {served[2]:.0f}] "
            f"| {f'{sum(reps) / len(reps):.2f}' if reps else 'n/a'} |"
        )
    pairs = list(zip(results["fixed"], results["tuneloop"], strict=True))
    share_diff = bootstrap_mean([t["within_slo"] - f["within_slo"] for f, t in pairs], plan.seed)
    ratio = bootstrap_mean([t["served"] / f["served"] for f, t in pairs], plan.seed)
    lines.append(
        f"tuneloop - fixed, share within SLO: {share_diff[0]:+.2f} "
        f"[{share_diff[1]:+.2f}, {share_diff[2]:+.2f}]; served, tuneloop / fixed: "
        f"{ratio[0]:.3f} [{ratio[1]:.3f}, {ratio[2]:.3f}] (paired by repeat, bootstrap 95%)"
    )
    return lines


def reanalyze(plan: argparse.Namespace, root: Path, slos_ms: Sequence[float]) -> None:
    """The tables again from a finished run's records (``ROOT/run*/load.json``), at other
    SLOs too: how the verdict depends on the bound (the study and the autoscaler still ran
    with the run's own)."""
    for slo_ms in slos_ms:
        results: dict[str, list[dict[str, Any]]] = {"fixed": [], "tuneloop": []}
        for repeat in range(plan.repeats):
            for name in results:
                data = json.loads((root / f"run{repeat}-{name}" / "load.json").read_text())
                records = [Record(**r) for r in data["records"]]
                summary = summarize(records, plan.duration_s, slo_ms / 1000)
                results[name].append({**summary, "replicas": None})
        print(f"P99 bound {slo_ms:g} ms:")
        print("\n".join(report(results, plan)))


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rates", default="20,80,20", help="requests/s of each load step")
    parser.add_argument("--step-s", type=float, default=60.0)
    parser.add_argument("--slo-ms", type=float, default=150.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sweep-s", type=float, default=10.0)
    parser.add_argument("--max-replicas", type=int, default=2)
    parser.add_argument("--ab-rate", type=float, default=60.0)
    parser.add_argument("--ab-s", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--weights", help="trained weights (trained and cached if missing)")
    parser.add_argument("--skip-ab", action="store_true")
    parser.add_argument("--quick", action="store_true", help="one repeat of 3 x 15 s")
    parser.add_argument("--out", help="write every run's figures here (JSON)")
    parser.add_argument(
        "--reanalyze", metavar="DIR", help="only print the tables of the finished run in DIR"
    )
    parser.add_argument("--at-slos-ms", default="", help="with --reanalyze: e.g. 150,300,600")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.step_s, args.sweep_s, args.ab_s = 1, 15.0, 5.0, 15.0
    args.duration_s = len(args.rates.split(",")) * args.step_s
    return args


def main(argv: Sequence[str] | None = None) -> None:
    plan = parse(argv)
    if plan.reanalyze:
        slos = [float(x) for x in plan.at_slos_ms.split(",") if x] or [plan.slo_ms]
        reanalyze(plan, Path(plan.reanalyze), slos)
        return
    root = Path(tempfile.mkdtemp(prefix="tuneloop-inference-"))
    weights = Path(plan.weights) if plan.weights else root / "digits-mlp.pt"
    say(f"load average {os.getloadavg()[0]:.1f}; work in {root}")
    models.load_or_train(weights)
    best = sweep(plan, weights, _dir(root / "sweep"))
    results: dict[str, list[dict[str, Any]]] = {"fixed": [], "tuneloop": []}
    settings = {"TUNELOOP_AUTOSCALE_INTERVAL_S": "2"}
    with control_plane(_dir(root / "plane"), say, settings) as plane:
        admin = admin_token(root / "plane")
        for repeat in range(plan.repeats):
            order = ["fixed", "tuneloop"] if repeat % 2 == 0 else ["tuneloop", "fixed"]
            for name in order:
                workdir = _dir(root / f"run{repeat}-{name}")
                say(f"repeat {repeat + 1}/{plan.repeats}: {name}, load {os.getloadavg()[0]:.1f}")
                job = f"digits-{name}-{repeat}"
                if name == "fixed":
                    result = fixed_run(plan, plane, weights, workdir, best, job)
                else:
                    result = tuned_run(plan, plane, admin, weights, workdir, job)
                result["load"] = os.getloadavg()[0]
                results[name].append(result)
                say(f"  {json.dumps({k: v for k, v in result.items() if k != 'trials'})}")
    lines = [f"fixed config (sweep at {mean_rate(plan.rates):g}/s): {best}", *report(results, plan)]
    verdict = None
    if not plan.skip_ab:
        verdict = ab(plan, weights, _dir(root / "ab"), best)
        lines.append(
            f"A/B at {plan.ab_rate:g}/s: throughput {verdict.throughput[0]:.1f} vs "
            f"{verdict.throughput[1]:.1f}/s; P99 {1e3 * verdict.p99_s[0]:.1f} vs "
            f"{1e3 * verdict.p99_s[1]:.1f} ms; {verdict.summary}"
        )
    lines.append(f"load average at the end: {os.getloadavg()[0]:.1f}")
    print("\n".join(lines), flush=True)
    if plan.out:
        data: dict[str, Any] = {"plan": vars(plan), "fixed_config": best, "runs": results}
        data["report"] = lines
        data["ab"] = None if verdict is None else repr(verdict)
        Path(plan.out).write_text(json.dumps(data, indent=1, default=str))


def _dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


if __name__ == "__main__":
    main()
