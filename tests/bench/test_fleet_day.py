"""The storage benchmarks' day of fleet data (bench/fleet_day.py) is what the real sources send:
dcgm-exporter's default fields in its formats, and step timing exactly as the OTLP receiver
maps a job's step and phase spans."""

from __future__ import annotations

import numpy as np
from fleet_day import BATCH_SAMPLES, BATCH_TOKENS, PHASE_SHARES, dcgm_day, steps_day, writes
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from collector.otlp.traces import map_spans
from collector.sources.dcgm_fields import load_counters
from tests.otlp.builders import span, traces_request
from tuneloop.storage.types import from_micros

INTEGER_FIELDS = {
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
}


def test_dcgm_day_has_dcgm_exporters_fields_kinds_and_formats() -> None:
    data = dcgm_day(hours=1.0)
    assert data.series == 1000 and data.samples == 1000 * 240
    defaults = {field.name: field.kind for field in load_counters() if not field.is_label}
    for group in data.groups:
        assert np.all(np.diff(group.stamps_us) > 14_000_000)
        for series in group.series:
            assert defaults[series.metric] is series.kind
            assert list(series.labels)[:6] == [
                "gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname",
            ]  # fmt: skip
            if series.metric in INTEGER_FIELDS:
                assert np.array_equal(series.values, np.rint(series.values))
            if series.metric == "DCGM_FI_DEV_POWER_USAGE":  # NVML's milliwatts
                assert np.allclose(series.values * 1000, np.rint(series.values * 1000))
            if series.metric == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION":
                assert np.all(np.diff(series.values) > 0)


def _spans(group_stamps: np.ndarray, values: dict[str, np.ndarray]) -> list[Span]:
    """The step and phase spans that would make these samples: each step ends at its stamp."""
    spans = []
    for i, stamp in enumerate(group_stamps.tolist()):
        trace, step_id = i.to_bytes(16, "big"), b"\x00" * 7 + b"\x01"
        end = stamp * 1000
        seconds = float(values["tuneloop_step_duration_seconds"][i])
        spans.append(
            span(
                "tuneloop.step",
                end - round(seconds * 1e9),
                end,
                span_id=step_id,
                trace_id=trace,
                labels={
                    "tuneloop.step": int(values["tuneloop_step_number"][i]),
                    "tuneloop.samples": BATCH_SAMPLES,
                    "tuneloop.tokens": BATCH_TOKENS,
                },
            )
        )
        for k, phase in enumerate(PHASE_SHARES):
            length = round(float(values[phase][i]) * 1e9)
            spans.append(
                span(
                    f"tuneloop.phase.{phase}",
                    end - length,
                    end,
                    span_id=b"\x00" * 7 + bytes([k + 2]),
                    parent=step_id,
                    trace_id=trace,
                )
            )
    return spans


def test_step_timing_is_what_the_receiver_makes_of_the_spans() -> None:
    data = steps_day(jobs=2, ranks=2, hours=0.1)
    assert data.series == 2 * 2 * 9
    for group in data.groups:
        labels = group.series[0].labels
        values = {s.labels.get("phase", s.metric): s.values for s in group.series}
        request = traces_request(
            _spans(group.stamps_us, values),
            {"tuneloop.job": labels["job"], "tuneloop.rank": labels["rank"]},
        )
        mapped = map_spans(request, now=data.end, max_series=100)
        assert not mapped.rejections.total, mapped.rejections
        received = {(b.metric, tuple(sorted(b.labels.items()))): b for b in mapped.batches}
        assert len(received) == len(group.series) == 9
        stamps = [from_micros(t) for t in group.stamps_us.tolist()]
        for series in group.series:
            batch = received[(series.metric, tuple(sorted(series.labels.items())))]
            assert list(batch.timestamps) == stamps
            np.testing.assert_allclose(batch.values, series.values, rtol=1e-12)


def test_writes_cut_every_sample_into_hour_long_writes_once() -> None:
    data = dcgm_day(gpus=16, hours=2.5)
    written = list(writes(data))
    assert len(written) == 3
    assert sum(len(b.values) for write in written for b in write) == data.samples
