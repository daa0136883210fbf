"""``tuneloop demo --quick`` end to end, as a user runs it: the control plane on the embedded
default (a real ``tuneloop up`` child process), a real 2-process PyTorch DDP job tuned live
through the API, the tuner and the actuator, then fresh runs of three configs. Checks the
output and what the store recorded, not the figures (those are the demo's to measure)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path


def test_quick_demo_tunes_the_live_job_and_compares_three_configs(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    done = subprocess.run(
        [sys.executable, "-m", "tuneloop", "demo", "--quick", "--dir", str(workdir)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    for line in ("phase 1: tuning the running job live", "phase 2:", "tuned vs start:"):
        assert line in out, out
    assert "tuned vs default:" in out
    assert "time to 90%" in out

    summary = json.loads((workdir / "demo.json").read_text())
    configs = summary["configs"]
    assert set(configs) == {"start", "default", "tuned"}
    assert configs["start"]["config"] == {"batch_size": 4, "sync_period": 1}
    assert configs["default"]["config"] == {"batch_size": 32, "sync_period": 1}
    for label, entry in configs.items():
        assert len(entry["runs"]) == 2, label
        for run in entry["runs"]:
            # Each fresh run really ran the config it was given, on both ranks' data.
            assert run["batch_size"] == entry["config"]["batch_size"]
            assert run["sync_period"] == entry["config"]["sync_period"]
            assert run["throughput_samples_s"] > 0
            assert run["emulation"] == {"input_delay_ms": 2.0, "sync_latency_ms": 25.0}
    tuned = configs["tuned"]["config"]
    assert 4 <= tuned["batch_size"] <= 64 and 1 <= tuned["sync_period"] <= 4

    db = sqlite3.connect(workdir / "store" / "tuneloop.db")
    state, trials = db.execute(
        "SELECT s.state, count(t.id) FROM studies s JOIN trials t ON t.study_id = s.id "
        "GROUP BY s.id"
    ).fetchone()
    assert (state, trials) == ("complete", 3)
    # The study's best config was written as the job's desired config and the job ran it.
    desired = db.execute(
        "SELECT config FROM job_configs c JOIN jobs j ON j.id = c.job_id "
        "WHERE j.name = 'digits' AND c.kind = 'desired' ORDER BY c.version DESC LIMIT 1"
    ).fetchone()[0]
    best = json.loads(desired)
    assert {k: best[k] for k in ("batch_size", "sync_period")} == tuned
    acks = db.execute("SELECT count(*) FROM audit_log WHERE action = 'job.config.ack'").fetchone()[
        0
    ]
    assert acks >= 3  # every trial's config was applied and acknowledged by the job
