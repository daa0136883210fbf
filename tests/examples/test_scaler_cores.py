"""The scaler starts no replica the host has no free core for (``--cores-per-replica``):
real replica processes, the host's real load average."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from examples.inference import model as models
from examples.inference.scaler import ReplicaPool


@pytest.fixture
def server_args(tmp_path: Path) -> list[str]:
    path = tmp_path / "weights.pt"
    torch.save(models.build().state_dict(), path)
    return ["--weights", str(path)]


def test_no_scale_out_without_a_free_core(server_args: list[str], tmp_path: Path) -> None:
    # More cores per replica than the host has: there is never a free core for another one.
    needy = (os.cpu_count() or 1) + 1.0
    pool = ReplicaPool(server_args, tmp_path / "logs", cores_per_replica=needy)
    try:
        assert pool.scale(1, "test: the first is never refused") == 1
        assert pool.scale(2, "test: no free core") == 1
        assert pool.count() == 1
        assert pool.scale(0, "test: scaling in is never refused") == 0
    finally:
        pool.close()


def test_the_check_is_off_at_zero_cores_per_replica(server_args: list[str], tmp_path: Path) -> None:
    pool = ReplicaPool(server_args, tmp_path / "logs", cores_per_replica=0)
    try:
        assert pool.scale(1, "test") == 1
        assert pool.scale(2, "test: no check") == 2
    finally:
        pool.close()


def test_closing_the_pool_stops_a_replica_still_draining(
    server_args: list[str], tmp_path: Path
) -> None:
    pool = ReplicaPool(server_args, tmp_path / "logs", cores_per_replica=0)
    try:
        assert pool.scale(1, "test") == 1
        [replica] = pool.replicas
        assert pool.scale(0, "test: scaled in, draining") == 0
    finally:
        pool.close()
    assert replica.process.poll() is not None  # stopped, not left to a daemon thread
