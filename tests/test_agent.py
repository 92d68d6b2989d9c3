"""The node agent's checks, without a network: roles, parameters, environment, token."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import grpc
import pytest

from pytest_tfgrpc.hosts.agent import RoleError, read_token, role_argv
from pytest_tfgrpc.wire.fabric import Fabric

FABRIC = Fabric(name="fab0", address="198.18.0.2", family="ipv4")
LINK_LOCAL = Fabric(name="ib0", address="fe80::1", family="ipv6", zone="ib0")


def test_each_role_runs_its_own_module_bound_where_the_agent_says() -> None:
    argv, _ = role_argv("ps", {"workers": "8", "delay": "1ms"}, {}, FABRIC)
    assert argv[:3] == [sys.executable, "-m", "pytest_tfgrpc.roles.tensor_server"]
    assert argv[3:] == ["--fabric", "fab0", "--port", "0", "--exit-on-stdin-eof", "--delay",
                        "1ms", "--workers", "8"]  # fmt: skip
    argv, _ = role_argv("worker", {}, {}, FABRIC)
    assert argv == [sys.executable, "-m", "pytest_tfgrpc.ps.worker"]
    argv, _ = role_argv("floor_server", {}, {}, LINK_LOCAL)
    assert argv[3:] == ["--bind", "fe80::1%ib0", "--port", "0"]


@pytest.mark.parametrize(
    ("role", "params", "env", "code", "message"),
    [
        ("bash", {}, {}, "PERMISSION_DENIED", "role 'bash' is not one this agent runs"),
        ("", {}, {}, "PERMISSION_DENIED", "role '' is not one"),
        ("../worker", {}, {}, "PERMISSION_DENIED", "role '../worker'"),
        ("tensor_server", {"fabric": "eth0"}, {}, "INVALID_ARGUMENT", "no parameter 'fabric'"),
        ("tensor_server", {"port": "22"}, {}, "INVALID_ARGUMENT", "no parameter 'port'"),
        ("ps", {"workers": "0"}, {}, "INVALID_ARGUMENT", "workers='0'"),
        ("ps", {"workers": "9999"}, {}, "INVALID_ARGUMENT", "workers='9999'"),
        ("ps", {"workers": "-1"}, {}, "INVALID_ARGUMENT", "workers='-1'"),
        ("ps", {"delay": "11s"}, {}, "INVALID_ARGUMENT", "delay='11s': from 0 to 10 s"),
        ("ps", {"delay": "1h"}, {}, "INVALID_ARGUMENT", "delay='1h': cannot read"),
        ("ps", {"delay": "$(reboot)"}, {}, "INVALID_ARGUMENT", "delay='$(reboot)'"),
        ("worker", {"workers": "2"}, {}, "INVALID_ARGUMENT", "its parameters: none"),
        ("worker", {}, {"LD_PRELOAD": "/tmp/x.so"}, "INVALID_ARGUMENT", "LD_PRELOAD"),
        ("worker", {}, {"PYTHONPATH": "/tmp"}, "INVALID_ARGUMENT", "PYTHONPATH"),
        ("worker", {}, {"MALLOC_ARENA_MAX": "2; x"}, "INVALID_ARGUMENT", "MALLOC_ARENA_MAX"),
        ("ps", {"max_tensor_bytes": "1e9"}, {}, "INVALID_ARGUMENT", "max_tensor_bytes='1e9'"),
        ("ps", {"max_tensor_bytes": "-5"}, {}, "INVALID_ARGUMENT", "max_tensor_bytes='-5'"),
        ("ps", {"max_tensor_bytes": str(1 << 40)}, {}, "INVALID_ARGUMENT", "max_tensor_bytes="),
        ("worker", {"max_tensor_bytes": "4"}, {}, "INVALID_ARGUMENT", "its parameters: none"),
        # the job-control token goes to a PS only, and only as a token
        ("worker", {}, {"TFGRPC_JOB_TOKEN": "a" * 32}, "INVALID_ARGUMENT", "TFGRPC_JOB_TOKEN"),
        ("ps", {}, {"TFGRPC_JOB_TOKEN": "short"}, "INVALID_ARGUMENT", "TFGRPC_JOB_TOKEN"),
        ("ps", {}, {"TFGRPC_JOB_TOKEN": "a" * 20 + ";rm"}, "INVALID_ARGUMENT", "TFGRPC_JOB"),
    ],
)
def test_requests_outside_the_roles_are_refused(
    role: str, params: dict[str, str], env: dict[str, str], code: str, message: str
) -> None:
    with pytest.raises(RoleError) as info:
        role_argv(role, params, env, FABRIC)
    assert info.value.code == getattr(grpc.StatusCode, code)
    assert message in str(info.value)


def test_allocator_variables_pass_and_nothing_else_of_the_drivers() -> None:
    _, env = role_argv("worker", {}, {"MALLOC_MMAP_THRESHOLD_": "33554432"}, FABRIC)
    assert env["MALLOC_MMAP_THRESHOLD_"] == "33554432"


def test_a_ps_gets_its_drivers_job_token_and_tensor_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TFGRPC_JOB_TOKEN", "the-agents-own-environment-token")
    argv, env = role_argv("ps", {"max_tensor_bytes": "4096"}, {}, FABRIC)
    assert argv[-2:] == ["--max-tensor-bytes", "4096"]
    assert "TFGRPC_JOB_TOKEN" not in env  # never a token the driver did not send
    token = "A-b_c" * 6
    _, env = role_argv("ps", {}, {"TFGRPC_JOB_TOKEN": token}, FABRIC)
    assert env["TFGRPC_JOB_TOKEN"] == token


def test_the_token_comes_from_a_file_or_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("a" * 20 + "\nignored\n")
    path.chmod(0o600)
    assert read_token(str(path), {"TFGRPC_AGENT_TOKEN": "b" * 20}) == "a" * 20
    assert read_token(None, {"TFGRPC_AGENT_TOKEN": " " + "b" * 20 + "\n"}) == "b" * 20
    with pytest.raises(ValueError, match="no agent token: give --token-file"):
        read_token(None, {})
    with pytest.raises(ValueError, match="fewer than 16"):
        read_token(None, {"TFGRPC_AGENT_TOKEN": "short"})
    with pytest.raises(ValueError, match=r"token file .*missing"):
        read_token(str(tmp_path / "missing"), {})
    path.write_text("")
    with pytest.raises(ValueError, match="no agent token"):
        read_token(str(path), {})


@pytest.mark.parametrize("mode", [0o644, 0o604, 0o602, 0o620, 0o666, 0o777])
def test_a_token_file_others_could_read_or_change_is_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "token"
    path.write_text("a" * 20 + "\n")
    path.chmod(mode)
    with pytest.raises(ValueError, match=rf"readable or writable by others .*chmod 600 {path}$"):
        read_token(str(path), {})
    path.chmod(0o640)  # a group may read it (a Kubernetes secret with fsGroup)
    assert read_token(str(path), {}) == "a" * 20


def test_a_token_file_that_is_not_a_file_or_not_ours_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a regular file"):
        read_token(str(tmp_path), {})
    path = tmp_path / "token"
    path.write_text("a" * 20 + "\n")
    path.chmod(0o600)
    if os.geteuid() == 0:
        os.chown(path, 12345, 12345)
        with pytest.raises(ValueError, match="belongs to uid 12345"):
            read_token(str(path), {})


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((), (None, None, None)),
        # one family of files: the run's own secure the agents too
        (("--tfgrpc-tls-ca=ca", "--tfgrpc-tls-cert=c", "--tfgrpc-tls-key=k"), ("ca", "c", "k")),
        # the agents' own win, as a set
        (("--tfgrpc-tls-ca=ca", "--tfgrpc-agent-tls-ca=aca"), ("aca", None, None)),
        # without a CA the agents cannot be verified: plaintext to them, as before
        (("--tfgrpc-tls-cert=c", "--tfgrpc-tls-key=k"), (None, None, None)),
    ],
)
def test_agent_tls_defaults_to_the_runs_tls(
    pytester: pytest.Pytester, args: tuple[str, ...], expected: tuple[str | None, ...]
) -> None:
    from pytest_tfgrpc.plugin.agents import agent_tls_files

    config = pytester.parseconfig(*args)
    assert agent_tls_files(config) == expected


def test_the_agents_token_never_reaches_a_role(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TFGRPC_AGENT_TOKEN", "x" * 32)
    for role in ("tensor_server", "ps", "worker"):
        _, env = role_argv(role, {}, {}, FABRIC)
        assert "TFGRPC_AGENT_TOKEN" not in env
