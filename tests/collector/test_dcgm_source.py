"""DcgmSource against FakeDcgm (recorded values through DcgmReader's shapes; see fakes.py),
plus the counter-CSV parser and DCGM's blank sentinels."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from collector.points import Point
from collector.sources import dcgm_fields
from collector.sources.dcgm import (
    DcgmConnectionError,
    DcgmSource,
    DcgmUnavailableError,
    load_dcgm_modules,
)
from collector.sources.dcgm_fields import CounterCsvError, PromType
from tests.collector.fakes import (
    DCGM_FP64_NOT_SUPPORTED,
    DCGM_INT32_NOT_SUPPORTED,
    DCGM_INT64_NOT_SUPPORTED,
    FE_GPU,
    FE_GPU_I,
    FE_NONE,
    FakeDcgm,
    FakeDcgmGpu,
    FakeGpuInstance,
)
from tuneloop.storage.timeseries.types import SeriesKind

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
UUID0 = "GPU-5c3d8a27-6b1e-4f0a-9d42-7e1b0c9a3f61"
UUID1 = "GPU-a18f2c44-03d9-4b7e-8c15-2f6d9e0b7a38"
UUID2 = "GPU-6f1a3d98-b4e2-47c0-95a6-c83b0e2d7f49"

# Recorded from dcgmi dmon-style readings of an H100 80GB HBM3 under training load.
H100_BUSY = {
    "DCGM_FI_DEV_SM_CLOCK": (1980, "i"),
    "DCGM_FI_DEV_MEM_CLOCK": (2619, "i"),
    "DCGM_FI_DEV_MEMORY_TEMP": (62, "i"),
    "DCGM_FI_DEV_GPU_TEMP": (54, "i"),
    "DCGM_FI_DEV_POWER_USAGE": (688.112, "d"),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": (9_312_884_417, "i"),  # > 2**31: not a blank
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": (0, "i"),
    "DCGM_FI_DEV_GPU_UTIL": (100, "i"),
    "DCGM_FI_DEV_MEM_COPY_UTIL": (63, "i"),
    "DCGM_FI_DEV_ENC_UTIL": (0, "i"),
    "DCGM_FI_DEV_DEC_UTIL": (0, "i"),
    "DCGM_FI_DEV_XID_ERRORS": (0, "i"),
    "DCGM_FI_DEV_FB_FREE": (4140, "i"),
    "DCGM_FI_DEV_FB_USED": (76822, "i"),
    "DCGM_FI_DEV_FB_RESERVED": (597, "i"),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": (48_213_397_264, "i"),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": (0, "i"),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": (0, "i"),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": (0, "i"),
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": (DCGM_INT64_NOT_SUPPORTED, "i"),  # bare metal
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": (0.982431, "d"),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": (0.612847, "d"),
    "DCGM_FI_PROF_DRAM_ACTIVE": (0.553719, "d"),
    "DCGM_FI_PROF_PCIE_TX_BYTES": (1_183_744, "i"),
    "DCGM_FI_PROF_PCIE_RX_BYTES": (25_417_932, "i"),
}


def recorded_node(**kwargs: bool) -> FakeDcgm:
    """GPUs 0 and 1 whole; GPU 2 in MIG mode with GPU instances 0 (4g.40gb, NVML GI 1) and
    1 (3g.40gb, NVML GI 2)."""
    dcgm = FakeDcgm(
        [
            FakeDcgmGpu(0, UUID0, "00000000:18:00.0"),
            FakeDcgmGpu(1, UUID1, "00000000:2A:00.0"),
            FakeDcgmGpu(2, UUID2, "00000000:DB:00.0"),
        ],
        [FakeGpuInstance(0, 2, 1, "4g.40gb"), FakeGpuInstance(1, 2, 2, "3g.40gb")],
        **kwargs,
    )
    dcgm.record(FE_NONE, 0, "DCGM_FI_DRIVER_VERSION", "570.133.20", "s")
    for gpu in (0, 1, 2):
        for name, (value, kind) in H100_BUSY.items():
            dcgm.record(FE_GPU, gpu, name, value, kind)
    dcgm.record(FE_GPU, 1, "DCGM_FI_DEV_XID_ERRORS", 48)
    dcgm.record(FE_GPU, 1, "DCGM_FI_PROF_DRAM_ACTIVE", DCGM_FP64_NOT_SUPPORTED, "d")
    dcgm.record(FE_GPU, 1, "DCGM_FI_DEV_ENC_UTIL", DCGM_INT32_NOT_SUPPORTED)  # int32 band
    dcgm.record(FE_GPU, 1, "DCGM_FI_DEV_DEC_UTIL", DCGM_INT64_NOT_SUPPORTED)
    for entity, used, gr in ((0, 36021, 0.731904), (1, 0, 0.0)):
        dcgm.record(FE_GPU_I, entity, "DCGM_FI_DEV_SM_CLOCK", 1980)
        dcgm.record(FE_GPU_I, entity, "DCGM_FI_DEV_POWER_USAGE", 312.448, "d")
        dcgm.record(FE_GPU_I, entity, "DCGM_FI_DEV_GPU_UTIL", DCGM_INT64_NOT_SUPPORTED)
        dcgm.record(FE_GPU_I, entity, "DCGM_FI_DEV_FB_USED", used)
        dcgm.record(FE_GPU_I, entity, "DCGM_FI_DEV_XID_ERRORS", 0)
        dcgm.record(FE_GPU_I, entity, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", gr, "d")
    return dcgm


def collect(dcgm: FakeDcgm) -> list[Point]:
    source = DcgmSource(hostname="gpu-node-17", modules=dcgm.modules())
    source.start()
    return source.collect(NOW)


def index(points: list[Point]) -> dict[tuple[str, str, str], Point]:
    by_key: dict[tuple[str, str, str], Point] = {}
    for point in points:
        key = (point.metric, point.labels["UUID"], point.labels.get("GPU_I_ID", ""))
        assert key not in by_key, key
        by_key[key] = point
    return by_key


def test_series_carry_dcgm_exporter_names_labels_and_kinds() -> None:
    points = index(collect(recorded_node()))

    power = points[("DCGM_FI_DEV_POWER_USAGE", UUID0, "")]
    assert power.value == pytest.approx(688.112)
    assert power.kind is SeriesKind.GAUGE and power.ts == NOW
    assert list(power.labels.items()) == [
        ("gpu", "0"),
        ("UUID", UUID0),
        ("pci_bus_id", "00000000:18:00.0"),
        ("device", "nvidia0"),
        ("modelName", "NVIDIA H100 80GB HBM3"),
        ("Hostname", "gpu-node-17"),
        ("DCGM_FI_DRIVER_VERSION", "570.133.20"),
    ]
    energy = points[("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", UUID0, "")]
    assert (energy.value, energy.kind) == (9_312_884_417, SeriesKind.COUNTER)
    assert points[("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", UUID0, "")].kind is SeriesKind.COUNTER
    assert points[("DCGM_FI_PROF_PCIE_RX_BYTES", UUID0, "")].value == 25_417_932

    xid = points[("DCGM_FI_DEV_XID_ERRORS", UUID1, "")]
    assert xid.value == 48
    assert list(xid.labels.items())[-2:] == [
        ("err_code", "48"),
        ("err_msg", "Double Bit ECC Error"),
    ]
    metrics = {metric for metric, _, _ in points}
    assert "DCGM_FI_DEV_NAME" not in metrics  # watched for MIG profiles, never emitted
    assert "DCGM_FI_DRIVER_VERSION" not in metrics  # a label row, not a series


def test_blank_sentinels_are_skipped() -> None:
    points = index(collect(recorded_node()))
    metrics = {metric for metric, _, _ in points}
    assert "DCGM_FI_DEV_VGPU_LICENSE_STATUS" not in metrics  # int64 NOT_SUPPORTED everywhere
    assert ("DCGM_FI_PROF_DRAM_ACTIVE", UUID1, "") not in points  # FP64 NOT_SUPPORTED
    assert ("DCGM_FI_DEV_ENC_UTIL", UUID1, "") not in points  # int32 sentinel in an int64
    assert ("DCGM_FI_DEV_DEC_UTIL", UUID1, "") not in points  # int64 NOT_SUPPORTED
    assert ("DCGM_FI_PROF_DRAM_ACTIVE", UUID0, "") in points
    assert ("DCGM_FI_DEV_ENC_UTIL", UUID0, "") in points


def test_mig_gpu_is_reported_per_gpu_instance() -> None:
    dcgm = recorded_node()
    points = index(collect(dcgm))

    reader = dcgm.readers[-1]
    assert reader.m_requestedGpuIds == [0, 1]  # the MIG parent only through its instances
    assert [(e.entityGroupId, e.entityId) for e in reader.m_requestedEntities or []] == [
        (FE_GPU_I, 0),
        (FE_GPU_I, 1),
    ]
    first = points[("DCGM_FI_DEV_FB_USED", UUID2, "1")]  # GPU_I_ID is NVML's GI id
    assert first.value == 36021
    assert list(first.labels.items())[:8] == [
        ("gpu", "2"),
        ("UUID", UUID2),
        ("pci_bus_id", "00000000:DB:00.0"),
        ("device", "nvidia2"),
        ("modelName", "NVIDIA H100 80GB HBM3"),
        ("GPU_I_PROFILE", "4g.40gb"),
        ("GPU_I_ID", "1"),
        ("Hostname", "gpu-node-17"),
    ]
    assert points[("DCGM_FI_DEV_FB_USED", UUID2, "2")].labels["GPU_I_PROFILE"] == "3g.40gb"
    assert ("DCGM_FI_DEV_GPU_UTIL", UUID2, "1") not in points  # blank per instance
    assert not [key for key in points if key[1] == UUID2 and key[2] == ""]


@pytest.mark.parametrize(
    "variant",
    [{"dcgm_46_names": True}, {"dcgm_46_names": True, "without_deprecated_aliases": True}],
)
def test_dcgm_46_renamed_constants_resolve_to_the_exporter_names(variant: dict[str, bool]) -> None:
    classic = {(p.metric, tuple(p.labels.items()), p.value) for p in collect(recorded_node())}
    renamed = {
        (p.metric, tuple(p.labels.items()), p.value) for p in collect(recorded_node(**variant))
    }
    assert renamed == classic
    assert ("DCGM_FI_DEV_GPU_TEMP", UUID0) in {
        (p.metric, p.labels["UUID"]) for p in collect(recorded_node(**variant))
    }


def test_user_counter_csv_selects_fields(tmp_path: Path) -> None:
    csv = tmp_path / "counters.csv"
    csv.write_text(
        "# my fields\n"
        "DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).\n"
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION , counter, Energy, in mJ, since boot\n"
        "DCGM_FI_DEV_NOT_IN_THESE_BINDINGS, gauge, from a newer DCGM\n"
        "DCGM_FI_DRIVER_VERSION, label, Driver Version\n"
    )
    dcgm = recorded_node()
    source = DcgmSource(fields_csv=csv, hostname="h", modules=dcgm.modules())
    source.start()
    points = source.collect(NOW)
    assert {p.metric for p in points} == {
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    }
    assert source.unknown_fields == ["DCGM_FI_DEV_NOT_IN_THESE_BINDINGS"]
    assert all(p.labels["DCGM_FI_DRIVER_VERSION"] == "570.133.20" for p in points)


def test_host_engine_down_raises_then_recovers() -> None:
    dcgm = recorded_node()
    dcgm.up = False
    source = DcgmSource(hostname="h", modules=dcgm.modules())
    source.start()  # configuration is fine: start does not need the engine
    with pytest.raises(DcgmConnectionError):
        source.collect(NOW)

    dcgm.up = True
    assert source.collect(NOW)


def test_host_engine_lost_mid_run_raises_and_reconnects() -> None:
    dcgm = recorded_node()
    source = DcgmSource(hostname="h", modules=dcgm.modules())
    source.start()
    assert source.collect(NOW)

    dcgm.up = False
    with pytest.raises(DcgmConnectionError):
        source.collect(NOW)
    assert dcgm.shutdowns == 1  # the broken reader was let go

    dcgm.up = True
    assert source.collect(NOW)
    assert len(dcgm.readers) == 2  # a fresh DcgmReader, after re-discovery
    source.shutdown()
    assert dcgm.shutdowns == 2


def test_missing_bindings_raise_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DcgmUnavailableError, match=str(tmp_path)):
        DcgmSource(bindings_path=tmp_path).start()
    with pytest.raises(DcgmUnavailableError, match="datacenter-gpu-manager"):
        load_dcgm_modules()  # nothing on sys.path or the standard paths here


@pytest.fixture
def clean_imports() -> Iterator[None]:
    path, modules = list(sys.path), set(sys.modules)
    yield
    sys.path[:] = path
    for name in set(sys.modules) - modules:
        del sys.modules[name]


@pytest.mark.usefixtures("clean_imports")
def test_bindings_are_imported_from_a_configured_path(tmp_path: Path) -> None:
    for name in ("pydcgm", "dcgm_fields", "dcgm_structs", "dcgm_agent"):
        (tmp_path / f"{name}.py").write_text(f"NAME = {name!r}\n")
    (tmp_path / "DcgmReader.py").write_text("import pydcgm\n\nclass DcgmReader:\n    pass\n")
    modules = load_dcgm_modules(tmp_path)
    assert modules.pydcgm.NAME == "pydcgm"
    assert modules.DcgmReader.__name__ == "DcgmReader"


# -- counter CSV ----------------------------------------------------------------------------


def test_default_counters_parse_like_dcgm_exporter() -> None:
    fields = dcgm_fields.load_counters()
    by_name = {f.name: f for f in fields}
    assert len(fields) == 26  # uncommented rows of dcgm-exporter's default-counters.csv
    assert by_name["DCGM_FI_DEV_DEC_UTIL"].prom_type is PromType.GAUGE  # "DEC_UTIL ," row
    assert by_name["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].kind is SeriesKind.COUNTER
    assert by_name["DCGM_FI_DRIVER_VERSION"].is_label
    assert by_name["DCGM_FI_PROF_PCIE_TX_BYTES"].prom_type is PromType.GAUGE  # not the # row
    assert "DCGM_FI_DEV_POWER_VIOLATION" not in by_name  # commented out
    assert by_name["DCGM_FI_PROF_PCIE_TX_BYTES"].help.startswith("The rate of data transmitted")


def test_counter_csv_errors_name_their_lines() -> None:
    with pytest.raises(CounterCsvError, match=r"line 2: .*line 3: type 'histogram'"):
        dcgm_fields.parse_counters_csv(
            "DCGM_FI_DEV_GPU_UTIL, gauge, ok\nnot a field name, gauge, x\nDCGM_X, histogram, y\n"
        )
    with pytest.raises(CounterCsvError, match="cannot read"):
        dcgm_fields.load_counters("/nonexistent/counters.csv")


def test_counter_csv_tolerates_bom_crlf_and_repeats() -> None:
    fields = dcgm_fields.parse_counters_csv(
        "\ufeff# c\r\nDCGM_FI_DEV_GPU_UTIL,GAUGE\r\n\r\nDCGM_FI_DEV_GPU_UTIL, counter, again\r\n"
    )
    assert [(f.name, f.prom_type, f.help) for f in fields] == [
        ("DCGM_FI_DEV_GPU_UTIL", PromType.GAUGE, "")
    ]


@pytest.mark.parametrize(
    ("value", "blank"),
    [
        (0, False),
        (9_312_884_417, False),  # energy in mJ past 2**31
        (0x7FFFFFEF, False),
        (0x7FFFFFF0, True),  # DCGM_INT32_BLANK
        (0x7FFFFFF2, True),  # DCGM_INT32_NOT_SUPPORTED
        (0x7FFFFFFF, True),
        (0x80000000, False),
        (0x7FFFFFFFFFFFFFF0, True),  # DCGM_INT64_BLANK
        (0x7FFFFFFFFFFFFFF3, True),
        (0.5, False),
        (140737488355328.0, True),  # DCGM_FP64_BLANK
        (140737488355330.0, True),
        (float("nan"), True),
        ("<<<NOT_SUPPORTED>>>", True),
        ("570.133.20", False),
        (None, True),
    ],
)
def test_blank_sentinels(value: object, blank: bool) -> None:
    assert dcgm_fields.is_blank(value) is blank


def test_restart_after_shutdown_as_the_runner_does() -> None:
    dcgm = recorded_node()
    source = DcgmSource(hostname="h", modules=dcgm.modules())
    source.start()
    first = source.collect(NOW)
    source.shutdown()
    source.start()
    assert source.collect(NOW) == first
    assert len(dcgm.readers) == 2


def test_profiling_fields_unavailable_leaves_the_rest() -> None:
    dcgm = recorded_node()
    dcgm.profiling_supported = False
    source = DcgmSource(hostname="h", modules=dcgm.modules())
    source.start()
    metrics = {p.metric for p in source.collect(NOW)}

    assert "DCGM_FI_DEV_GPU_UTIL" in metrics
    assert not any(m.startswith("DCGM_FI_PROF_") for m in metrics)
    assert source.profiling_disabled
    assert len(dcgm.readers) == 2 and dcgm.shutdowns == 1  # the failed reader was released
