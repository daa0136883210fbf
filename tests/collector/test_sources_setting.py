"""The ``sources`` setting: ``auto`` detection (a real listening socket stands in for
nv-hostengine, a temporary directory for sysfs, the NVML fake for the driver), explicit specs,
per-kind intervals, and bad specs as one line and exit 2 from the CLI."""

from __future__ import annotations

import ctypes
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from collector.service import SourcePlan, plan_sources
from collector.sources import SourceSpecError
from collector.sources.auto import (
    DCGM_PORT,
    Detection,
    dcgm_answers,
    detect_sources,
    expand_auto,
    nvml_gpu_count,
)
from collector.sources.dcgm import DcgmSource
from tests.collector.fakes import FakeNvml, FakeNvmlDevice, nvml_error
from tests.helpers import free_port
from tuneloop.settings import Settings, SettingsError, load_settings


@pytest.fixture
def listening_port() -> Iterator[int]:
    """A port something accepts TCP connections on, as nv-hostengine would."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield int(server.getsockname()[1])


def gpus(count: int) -> FakeNvml:
    return FakeNvml([FakeNvmlDevice({}) for _ in range(count)])


def no_nvml_library() -> FakeNvml:
    nvml = gpus(0)
    nvml.init_error = nvml_error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    return nvml


# --------------------------------------------------------------------------- detection


def test_a_dcgm_host_engine_wins_over_nvml(listening_port: int, tmp_path: Path) -> None:
    detection = detect_sources(
        infiniband_root=tmp_path / "none",
        dcgm_host="127.0.0.1",
        dcgm_port=listening_port,
        nvml=gpus(8),
    )
    assert detection.specs == ("host", "dcgm")
    assert detection.gpu_source == "dcgm"
    assert detection.gpu_reason == f"a DCGM host engine answers on 127.0.0.1:{listening_port}"


def test_nvml_when_no_host_engine_answers(tmp_path: Path) -> None:
    closed = free_port()
    detection = detect_sources(
        infiniband_root=tmp_path / "none", dcgm_host="127.0.0.1", dcgm_port=closed, nvml=gpus(2)
    )
    assert detection.specs == ("host", "nvml")
    assert detection.gpu_reason == (
        f"no DCGM host engine on 127.0.0.1:{closed}; NVML reports 2 GPUs"
    )


@pytest.mark.parametrize(
    ("nvml", "why"),
    [
        (gpus(0), "NVML reports no GPU"),
        (no_nvml_library(), "NVML did not load (NVML Shared Library Not Found)"),
    ],
)
def test_no_gpu_source_without_gpus(nvml: FakeNvml, why: str, tmp_path: Path) -> None:
    closed = free_port()
    detection = detect_sources(
        infiniband_root=tmp_path / "none", dcgm_host="127.0.0.1", dcgm_port=closed, nvml=nvml
    )
    assert detection.specs == ("host",)
    assert detection.gpu_source is None
    assert detection.gpu_reason == f"no DCGM host engine on 127.0.0.1:{closed}; {why}"
    assert not nvml.initialized  # the probe ends its NVML session


def test_infiniband_when_sysfs_has_the_class(tmp_path: Path) -> None:
    (tmp_path / "infiniband").mkdir()
    detection = detect_sources(
        infiniband_root=tmp_path / "infiniband", dcgm_port=free_port(), nvml=gpus(0)
    )
    assert detection.specs == ("host", "infiniband")


def test_auto_on_this_machine() -> None:
    """The real probes, with nothing injected. Where the suite runs without a GPU, DCGM or
    InfiniBand, ``auto`` is this host alone; on a GPU node it adds the GPU source."""
    detection = detect_sources()
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        has_nvml = True
    except OSError:
        has_nvml = False
    has_dcgm = dcgm_answers()
    has_ib = Path("/sys/class/infiniband").is_dir()
    assert detection.specs[0] == "host"
    assert ("infiniband" in detection.specs) == has_ib
    if has_dcgm:
        assert detection.gpu_source == "dcgm"
    elif not has_nvml:
        assert detection.gpu_source is None
        assert detection.gpu_reason.startswith(f"no DCGM host engine on localhost:{DCGM_PORT}")
        assert "NVML" in detection.gpu_reason
    if not (has_nvml or has_dcgm or has_ib):
        assert detection.specs == ("host",)


def test_the_real_nvml_probe_never_raises() -> None:
    count, why = nvml_gpu_count()
    assert count >= 0 and (count > 0 or why)


# --------------------------------------------------------------------------- auto expansion

FOUND = Detection(("host", "infiniband", "nvml"), "nvml", "NVML reports 8 GPUs")


@pytest.mark.parametrize(
    ("specs", "expanded"),
    [
        (["auto"], ["host", "infiniband", "nvml"]),
        (
            ["auto", "scrape=http://n:9400/metrics"],
            ["host", "infiniband", "nvml", "scrape=http://n:9400/metrics"],
        ),
        # An explicit kind replaces what auto found for it...
        (["infiniband=/x", "auto"], ["infiniband=/x", "host", "nvml"]),
        (["AUTO", "host"], ["infiniband", "nvml", "host"]),
        # ...and any explicit GPU source replaces auto's, local or not.
        (["auto", "dcgm=node-7:5555"], ["host", "infiniband", "dcgm=node-7:5555"]),
        (["host", "nvml"], ["host", "nvml"]),
    ],
)
def test_auto_expands_to_what_is_not_given(specs: list[str], expanded: list[str]) -> None:
    assert expand_auto(specs, FOUND) == expanded


# --------------------------------------------------------------------------- plans


def settings(**values: object) -> Settings:
    return Settings(data_dir=Path("/nonexistent"), **values)  # type: ignore[arg-type]


def test_explicit_specs_get_intervals_by_kind(tmp_path: Path) -> None:
    plan = plan_sources(
        settings(
            sources=(
                "host",
                "dcgm=node-7",
                "scrape=http://n:9400/metrics",
                f"infiniband={tmp_path}",
            )
        ),
        detect=_never,
    )
    assert plan.intervals == {
        "host": 15.0,
        "dcgm": 10.0,
        "scrape:http://n:9400/metrics": 30.0,  # dcgm-exporter's own interval
        "infiniband": 15.0,
    }
    assert plan.describe() == (
        "host every 15s, dcgm every 10s, scrape:http://n:9400/metrics every 30s, "
        "infiniband every 15s"
    )
    (dcgm,) = [source for source in plan.sources if isinstance(source, DcgmSource)]
    assert dcgm._update_interval_s == 10.0


def test_intervals_are_overridable() -> None:
    plan = plan_sources(
        settings(
            sources=("host", "nvml", "scrape=http://n:9400/metrics"),
            collect_interval_s=60,
            gpu_interval_s=1,
            scrape_interval_s=5,
        ),
        detect=_never,
    )
    assert list(plan.intervals.values()) == [60.0, 1.0, 5.0]


def test_auto_says_which_gpu_source_and_why() -> None:
    plan = plan_sources(settings(), detect=lambda: FOUND)
    assert isinstance(plan, SourcePlan)
    assert [source.name for source in plan.sources] == ["host", "infiniband", "nvml"]
    assert plan.gpu_choice == "GPU source: nvml (NVML reports 8 GPUs)"
    # Without auto nothing is probed and there is nothing to say.
    assert plan_sources(settings(sources=("host",)), detect=_never).gpu_choice is None


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        (("gpu",), "'gpu': unknown source; known: host, nvml, dcgm, scrape, infiniband"),
        (("scrape",), "scrape needs a URL"),
        (("scrape=node:9400",), "http"),
        (("auto=yes",), "'auto=yes': auto takes no value"),
        (("host", "host"), "configured twice"),
    ],
)
def test_bad_specs_are_one_line(specs: tuple[str, ...], message: str) -> None:
    with pytest.raises(SourceSpecError) as excinfo:
        plan_sources(settings(sources=specs), detect=lambda: FOUND)
    assert message in str(excinfo.value) and "\n" not in str(excinfo.value)


def _never() -> Detection:
    raise AssertionError("auto was not asked for: nothing to detect")


# --------------------------------------------------------------------------- setting and CLI


def test_the_environment_gives_comma_separated_specs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TUNELOOP_SOURCES", raising=False)
    assert load_settings().sources == ("auto",)
    monkeypatch.setenv("TUNELOOP_SOURCES", " host , scrape=http://n:9400/metrics,")
    assert load_settings().sources == ("host", "scrape=http://n:9400/metrics")
    assert load_settings(sources=["nvml"]).sources == ("nvml",)  # --source wins
    monkeypatch.setenv("TUNELOOP_SOURCES", " , ")
    with pytest.raises(SettingsError, match=r"TUNELOOP_SOURCES: .*at least one source"):
        load_settings()


def run_cli(*args: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("TUNELOOP_")}
    environment["TUNELOOP_DATA_DIR"] = str(tmp_path / "data")
    return subprocess.run(
        [sys.executable, "-m", "tuneloop", *args],
        env={**environment, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("command", ["collect", "up"])
def test_a_bad_source_flag_is_one_line_and_exit_2(command: str, tmp_path: Path) -> None:
    result = run_cli(command, "--source", "host", "--source", "gpu", tmp_path=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [
        "tuneloop: invalid setting --source: 'gpu': unknown source; "
        "known: host, nvml, dcgm, scrape, infiniband"
    ]
    assert not (tmp_path / "data" / "tuneloop.db").exists()  # before the store is touched


def test_a_bad_sources_variable_names_it(tmp_path: Path) -> None:
    result = run_cli("collect", tmp_path=tmp_path, TUNELOOP_SOURCES="host,scrape")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "tuneloop: invalid setting TUNELOOP_SOURCES: 'scrape': scrape needs a URL, "
        "as scrape=http://host:9400/metrics"
    ]


def test_a_bad_interval_flag_is_named_as_given(tmp_path: Path) -> None:
    result = run_cli("collect", "--interval", "0", tmp_path=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == "tuneloop: invalid setting --interval: must be greater than 0"
