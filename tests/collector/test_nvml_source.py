"""NvmlSource against FakeNvml (recorded H100 answers; see tests/collector/fakes.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from collector.points import Point
from collector.sources.nvml import NvmlCollectError, NvmlSource, NvmlUnavailableError
from tests.collector.fakes import FakeNvml, nvml_error, recorded_h100_node
from tuneloop.storage.timeseries.types import SeriesKind

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
GPU0 = "GPU-5c3d8a27-6b1e-4f0a-9d42-7e1b0c9a3f61"
GPU1 = "GPU-a18f2c44-03d9-4b7e-8c15-2f6d9e0b7a38"
GPU2 = "GPU-6f1a3d98-b4e2-47c0-95a6-c83b0e2d7f49"


def index(points: list[Point]) -> dict[tuple[str, str, str], Point]:
    """(metric, UUID, GPU_I_ID or '') -> point; fails on duplicates."""
    by_key: dict[tuple[str, str, str], Point] = {}
    for point in points:
        key = (point.metric, point.labels["UUID"], point.labels.get("GPU_I_ID", ""))
        assert key not in by_key, key
        by_key[key] = point
    return by_key


def started(fake: FakeNvml) -> NvmlSource:
    source = NvmlSource(nvml=fake, hostname="gpu-node-17")
    source.start()
    return source


def test_h100_fields_use_dcgm_exporter_names_units_and_kinds() -> None:
    points = index(started(recorded_h100_node()).collect(NOW))

    def value(metric: str, uuid: str = GPU0, gi: str = "") -> float:
        return points[(metric, uuid, gi)].value

    assert value("DCGM_FI_DEV_GPU_UTIL") == 97
    assert value("DCGM_FI_DEV_MEM_COPY_UTIL") == 61
    assert value("DCGM_FI_DEV_ENC_UTIL") == 0
    assert value("DCGM_FI_DEV_FB_TOTAL") == 81559  # MiB, like DCGM
    assert value("DCGM_FI_DEV_FB_USED") == 76822
    assert value("DCGM_FI_DEV_FB_RESERVED") == 597
    assert value("DCGM_FI_DEV_FB_FREE") == 81559 - 597 - 76822
    assert value("DCGM_FI_DEV_POWER_USAGE") == pytest.approx(612.345)  # W from mW
    assert value("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") == 9_312_884_417  # mJ
    assert value("DCGM_FI_DEV_GPU_TEMP") == 54
    assert value("DCGM_FI_DEV_MEMORY_TEMP") == 62
    assert value("DCGM_FI_DEV_SM_CLOCK") == 1980
    assert value("DCGM_FI_DEV_MEM_CLOCK") == 2619
    assert value("DCGM_FI_PROF_PCIE_TX_BYTES") == 1156 * 1024  # bytes/s from KB/s
    assert value("DCGM_FI_PROF_PCIE_RX_BYTES") == 24822 * 1024
    assert value("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL") == 4_812_339_520 + 4_809_127_104
    assert value("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS") == 0x4  # SW power cap
    assert value("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL") == 2
    assert value("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL") == 0
    assert value("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS") == 1
    assert value("DCGM_FI_DEV_ROW_REMAP_FAILURE") == 0

    counters = {
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    }
    for (metric, _, _), point in points.items():
        expected = SeriesKind.COUNTER if metric in counters else SeriesKind.GAUGE
        assert point.kind is expected, metric
        assert point.ts == NOW


def test_labels_follow_dcgm_exporter_order_and_spelling() -> None:
    points = index(started(recorded_h100_node()).collect(NOW))
    labels = points[("DCGM_FI_DEV_POWER_USAGE", GPU0, "")].labels
    assert list(labels.items()) == [
        ("gpu", "0"),
        ("UUID", GPU0),
        ("pci_bus_id", "00000000:18:00.0"),  # decoded from the bytes older pynvml returns
        ("device", "nvidia0"),
        ("modelName", "NVIDIA H100 80GB HBM3"),
        ("Hostname", "gpu-node-17"),
        ("DCGM_FI_DRIVER_VERSION", "570.133.20"),
    ]
    assert points[("DCGM_FI_DEV_POWER_USAGE", GPU2, "")].labels["device"] == "nvidia7"  # minor


def test_mig_instances_carry_gpu_instance_labels() -> None:
    points = index(started(recorded_h100_node()).collect(NOW))
    first = points[("DCGM_FI_DEV_FB_USED", GPU2, "1")]
    second = points[("DCGM_FI_DEV_FB_USED", GPU2, "2")]
    assert first.value == 36021 and second.value == 0
    assert list(first.labels)[:8] == [
        "gpu",
        "UUID",
        "pci_bus_id",
        "device",
        "modelName",
        "GPU_I_PROFILE",
        "GPU_I_ID",
        "Hostname",
    ]
    assert first.labels["GPU_I_PROFILE"] == "4g.40gb"
    assert second.labels["GPU_I_PROFILE"] == "3g.40gb"
    # The MIG-mode parent reports device-level fields but no utilization (NotSupported).
    assert ("DCGM_FI_DEV_POWER_USAGE", GPU2, "") in points
    assert ("DCGM_FI_DEV_GPU_UTIL", GPU2, "") not in points


def test_not_supported_fields_are_skipped_and_not_asked_again() -> None:
    fake = recorded_h100_node()
    source = started(fake)
    first = index(source.collect(NOW))
    source.collect(NOW)

    assert not any(metric.startswith("DCGM_FI_DEV_RETIRED_") for metric, _, _ in first)
    gpu0, gpu2 = fake.devices[0], fake.devices[2]
    assert gpu0.calls["nvmlDeviceGetRetiredPages"] == 2  # once per cause, first poll only
    assert gpu0.calls["nvmlDeviceGetRetiredPagesPendingStatus"] == 1
    assert gpu2.calls["nvmlDeviceGetUtilizationRates"] == 1
    assert gpu0.calls["nvmlDeviceGetPowerUsage"] == 2  # supported fields are read every poll
    assert source.gpu_errors == {}


def test_gpu_fallen_off_the_bus_is_skipped_and_counted_while_others_report() -> None:
    fake = recorded_h100_node()
    source = started(fake)
    fake.devices[1].lost = True
    fake.pending_xids.append((fake.devices[1], 79))

    points = index(source.collect(NOW))

    uuids = {uuid for _, uuid, _ in points}
    assert GPU0 in uuids and GPU2 in uuids
    assert {metric for metric, uuid, _ in points if uuid == GPU1} == {"DCGM_FI_DEV_XID_ERRORS"}
    xid = points[("DCGM_FI_DEV_XID_ERRORS", GPU1, "")]
    assert xid.value == 79
    assert xid.labels["err_code"] == "79"
    assert xid.labels["err_msg"] == "GPU has fallen off the bus"
    assert source.gpu_errors[GPU1] == 1
    assert set(fake.wait_timeouts) == {0}  # never blocks the poll


def test_xid_reports_the_last_event_and_zero_without_one() -> None:
    fake = recorded_h100_node()
    source = started(fake)
    fake.pending_xids += [(fake.devices[0], 13), (fake.devices[0], 31)]

    points = index(source.collect(NOW))

    assert points[("DCGM_FI_DEV_XID_ERRORS", GPU0, "")].value == 31
    assert points[("DCGM_FI_DEV_XID_ERRORS", GPU0, "")].labels["err_msg"] == (
        "GPU memory page fault"
    )
    none = points[("DCGM_FI_DEV_XID_ERRORS", GPU2, "")]
    assert none.value == 0
    assert (none.labels["err_code"], none.labels["err_msg"]) == ("0", "No Error")
    assert list(none.labels)[-2:] == ["err_code", "err_msg"]


def test_all_gpus_failing_raises_for_the_runner() -> None:
    fake = recorded_h100_node()
    source = started(fake)
    for device in fake.devices:
        device.lost = True
    with pytest.raises(NvmlCollectError):
        source.collect(NOW)


def test_gpu_lost_at_discovery_is_retried_on_the_next_poll() -> None:
    fake = recorded_h100_node()
    fake.devices[1].lost = True
    source = started(fake)
    assert GPU1 not in {p.labels["UUID"] for p in source.collect(NOW)}
    assert source.gpu_errors["index:1"] >= 1

    fake.devices[1].lost = False
    assert GPU1 in {p.labels["UUID"] for p in source.collect(NOW)}


def test_init_failure_raises_a_clear_error() -> None:
    fake = recorded_h100_node()
    fake.init_error = nvml_error(9)  # NVML_ERROR_DRIVER_NOT_LOADED
    with pytest.raises(NvmlUnavailableError, match="Driver Not Loaded"):
        NvmlSource(nvml=fake).start()


def test_real_pynvml_without_a_gpu_raises_nvml_unavailable() -> None:
    # This machine has nvidia-ml-py but no driver: NVML's own "library not found" path.
    with pytest.raises(NvmlUnavailableError):
        NvmlSource(hostname="h").start()


def test_shutdown_releases_nvml_and_the_event_set() -> None:
    fake = recorded_h100_node()
    source = started(fake)
    assert fake.event_sets and fake.initialized
    source.shutdown()
    assert not fake.event_sets and not fake.initialized


def test_gpu_back_on_the_bus_is_looked_up_again_and_reports() -> None:
    fake = recorded_h100_node()
    source = started(fake)
    fake.devices[1].lost = True
    source.collect(NOW)
    lookups = fake.devices[1].calls["nvmlDeviceGetUUID"]

    fake.devices[1].lost = False
    points = index(source.collect(NOW))

    assert ("DCGM_FI_DEV_POWER_USAGE", GPU1, "") in points
    assert fake.devices[1].calls["nvmlDeviceGetUUID"] > lookups  # fresh handle and identity


def test_restart_after_shutdown_as_the_runner_does() -> None:
    fake = recorded_h100_node()
    source = started(fake)
    first = {(p.metric, tuple(p.labels.items())) for p in source.collect(NOW)}
    source.shutdown()
    source.start()
    second = {(p.metric, tuple(p.labels.items())) for p in source.collect(NOW)}
    assert second == first
    assert len(fake.event_sets) == 1
