"""Run metadata holds this machine's real values, under the names compare.py checks."""

from __future__ import annotations

import os
import platform
import socket
from importlib.metadata import version
from pathlib import Path

import google.protobuf
import grpc
import numpy as np
import pytest

import pytest_tfgrpc
import pytest_tfgrpc.report.metadata as metadata_module
from pytest_tfgrpc.report.metadata import (
    META_PREFIX,
    NOT_INSTALLED,
    RUN_KEYS,
    fabric_metadata,
    run_metadata,
)
from pytest_tfgrpc.report.setup_check import META_CHECKED
from pytest_tfgrpc.tuning.allocator import tune_allocator
from pytest_tfgrpc.wire.fabric import Fabric, resolve_fabric

M = META_PREFIX


def test_run_metadata_holds_this_machine_and_its_libraries() -> None:
    meta = run_metadata([resolve_fabric("lo")], environ={})
    assert meta[f"{M}host"] == socket.gethostname()
    assert meta[f"{M}python"] == platform.python_version()
    assert meta[f"{M}platform"] == platform.platform()
    assert meta[f"{M}cpus"] == str(os.cpu_count())
    assert meta[f"{M}cpus_usable"] == str(len(os.sched_getaffinity(0)))
    assert meta[f"{M}grpcio"] == grpc.__version__
    assert meta[f"{M}protobuf"] == google.protobuf.__version__
    assert meta[f"{M}numpy"] == np.__version__
    assert meta[f"{M}plugin"] == version("pytest-tfgrpc") == pytest_tfgrpc.__version__
    assert meta[f"{M}fabrics"] == "lo"
    assert all(f"{M}{key}" in meta for key in RUN_KEYS)
    assert all(isinstance(value, str) for value in meta.values())


def test_every_key_compare_checks_is_recorded() -> None:
    meta = run_metadata([resolve_fabric("lo")], environ={})
    assert {f"{M}{key}" for key in META_CHECKED} <= meta.keys()


def test_loopback_fabric_metadata_is_read_from_the_system() -> None:
    meta = run_metadata([resolve_fabric("lo")], environ={})
    lo = {k.removeprefix(f"{M}fabric.lo."): v for k, v in meta.items() if ".fabric.lo." in k}
    assert lo == {
        "address": "127.0.0.1",
        "family": "ipv4",
        "mtu": Path("/sys/class/net/lo/mtu").read_text().strip(),
        "speed_mbps": "unknown",  # lo reports no speed
        "link_type": "loopback",
    }
    assert lo["mtu"] == "65536"


def test_every_fabric_is_recorded_under_its_own_name(tmp_path: Path) -> None:
    eth = Fabric("eth0", "10.0.0.5", "ipv4", mtu=9000, link_type="ether", speed_mbps=25000)
    ib = Fabric("ib0.8001", "fe80::1", "ipv6", zone="ib0.8001", mtu=2044, link_type="infiniband")
    (tmp_path / "ib0.8001").mkdir()
    (tmp_path / "ib0.8001" / "mode").write_text("connected\n")
    (tmp_path / "eth0").mkdir()  # an Ethernet interface has no mode file
    meta = run_metadata([eth, ib], environ={}, sys_net=tmp_path)
    assert meta[f"{M}fabrics"] == "eth0,ib0.8001"
    assert meta[f"{M}fabric.eth0.mtu"] == "9000"
    assert meta[f"{M}fabric.eth0.speed_mbps"] == "25000"
    assert meta[f"{M}fabric.eth0.address"] == "10.0.0.5"
    assert f"{M}fabric.eth0.ipoib_mode" not in meta
    assert meta[f"{M}fabric.ib0.8001.ipoib_mode"] == "connected"
    assert meta[f"{M}fabric.ib0.8001.family"] == "ipv6"
    assert meta[f"{M}fabric.ib0.8001.link_type"] == "infiniband"
    assert meta[f"{M}fabric.ib0.8001.mtu"] == "2044"
    assert fabric_metadata(ib, sys_net=tmp_path) == {
        k: v for k, v in meta.items() if k.startswith(f"{M}fabric.ib0.8001.")
    }


def test_allocator_and_xdist_settings_are_recorded_when_present() -> None:
    environ = {
        "MALLOC_ARENA_MAX": "2",
        "MALLOC_MMAP_THRESHOLD_": "33554432",
        "PYTEST_XDIST_WORKER": "gw1",
        "PYTEST_XDIST_WORKER_COUNT": "2",
        "HOME": "/root",
    }
    meta = run_metadata([], environ=environ)
    assert meta[f"{M}env.MALLOC_ARENA_MAX"] == "2"
    assert meta[f"{M}env.MALLOC_MMAP_THRESHOLD_"] == "33554432"
    assert meta[f"{M}xdist.worker"] == "gw1"
    assert meta[f"{M}xdist.workers"] == "2"
    assert not any("HOME" in key for key in meta)
    assert meta[f"{M}fabrics"] == ""

    plain = run_metadata([], environ={"HOME": "/root"})
    assert not any(key.startswith((f"{M}env.", f"{M}xdist.")) for key in plain)


def test_thresholds_set_in_this_process_are_recorded() -> None:
    assert tune_allocator(mmap_threshold=32 << 20, trim_threshold=1 << 30)
    meta = run_metadata([], environ={})
    assert meta[f"{M}mallopt.M_MMAP_THRESHOLD"] == str(32 << 20)
    assert meta[f"{M}mallopt.M_TRIM_THRESHOLD"] == str(1 << 30)


def test_a_missing_distribution_is_recorded_as_such(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(metadata_module._DISTRIBUTIONS, "numpy", "no-such-distribution-tfgrpc")
    meta = run_metadata([], environ={})
    assert meta[f"{M}numpy"] == NOT_INSTALLED
