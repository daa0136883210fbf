"""build_sources: configured names to Source objects, with clear errors."""

from __future__ import annotations

import pytest

from collector.sources import SourceSpecError, build_sources
from collector.sources.dcgm import DcgmSource
from collector.sources.host import HostSource
from collector.sources.infiniband import InfinibandSource
from collector.sources.nvml import NvmlSource
from collector.sources.scrape import ScrapeSource


def test_known_names_build_their_sources() -> None:
    sources = build_sources(
        [
            "host",
            " NVML ",
            "dcgm",
            "scrape=http://gpu-node-1:9400/metrics",
            "scrape=http://gpu-node-1:9100/metrics",
            "infiniband=/tmp/ib",
        ],
        hostname="gpu-node-1",
    )
    kinds = [type(s) for s in sources]
    assert kinds == [
        HostSource,
        NvmlSource,
        DcgmSource,
        ScrapeSource,
        ScrapeSource,
        InfinibandSource,
    ]
    assert [s.name for s in sources][3:5] == [
        "scrape:http://gpu-node-1:9400/metrics",
        "scrape:http://gpu-node-1:9100/metrics",
    ]


def test_building_touches_no_hardware() -> None:
    # Constructing must not need NVML, DCGM or the network; they are reached in start/collect.
    (dcgm,) = build_sources(["dcgm=10.0.0.7:5555"])
    assert isinstance(dcgm, DcgmSource)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("gpu", "unknown source; known: host, nvml, dcgm, scrape, infiniband"),
        ("scrape", "scrape needs a URL"),
        ("scrape=gpu-node-1:9400", "http"),
        ("host=x", "host takes no value"),
    ],
)
def test_bad_entries_are_rejected(entry: str, message: str) -> None:
    with pytest.raises(SourceSpecError, match=message):
        build_sources([entry])


def test_duplicates_are_rejected() -> None:
    with pytest.raises(SourceSpecError, match="twice"):
        build_sources(["nvml", "nvml"])
