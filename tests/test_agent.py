"""The node agent's checks, without a network: roles, parameters, environment, token."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from pytest_tfgrpc.hosts.agent import (
    RoleError,
    engines_here,
    read_token,
    role_argv,
    tls_mismatch,
)
from pytest_tfgrpc.wire.fabric import Fabric
from pytest_tfgrpc.wire.security import TlsFiles

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
        # the job token goes to a PS task or a worker only, and only as a token
        ("tensor_server", {}, {"TFGRPC_JOB_TOKEN": "a" * 32}, "INVALID_ARGUMENT", "TFGRPC_JOB"),
        ("floor_server", {}, {"TFGRPC_JOB_TOKEN": "a" * 32}, "INVALID_ARGUMENT", "TFGRPC_JOB"),
        ("worker", {}, {"TFGRPC_JOB_TOKEN": "short"}, "INVALID_ARGUMENT", "TFGRPC_JOB_TOKEN"),
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
    # A worker sends it on every PS call.
    _, env = role_argv("worker", {}, {"TFGRPC_JOB_TOKEN": token}, FABRIC)
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
    with pytest.raises(ValueError, match=r"token file \(--tfgrpc-agent-token-file\) .*missing"):
        read_token(str(tmp_path / "missing"), {}, "--tfgrpc-agent-token-file")
    path.write_text("")
    with pytest.raises(ValueError, match="no agent token"):
        read_token(str(path), {})


def test_a_token_file_under_home_is_found_whatever_the_shell_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `--tfgrpc-agent-token-file=~/.tfgrpc-token` and ini files reach us with the ~ unexpanded
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".tfgrpc-token").write_text("a" * 20 + "\n")
    (tmp_path / ".tfgrpc-token").chmod(0o600)
    assert read_token("~/.tfgrpc-token", {}) == "a" * 20


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


# --- engines and TLS ---------------------------------------------------------------------------
def _built(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The native engine as if built in ``tmp_path`` (role_argv only names its programs)."""
    from pytest_tfgrpc.hosts import agent

    made = SimpleNamespace(
        **{name: tmp_path / f"tfgrpc-native-{name}" for name in ("server", "worker", "floor")}
    )
    monkeypatch.setattr(agent, "binaries", lambda: made)


def test_native_roles_run_the_hosts_own_build_bound_where_the_agent_says(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _built(monkeypatch, tmp_path)
    params = {"threads": "2", "delay": "1ms", "max_tensor_bytes": "4096"}
    argv, _ = role_argv("tensor_server", params, {}, FABRIC, engine="native")
    assert argv == [
        str(tmp_path / "tfgrpc-native-server"), "--host", "198.18.0.2", "--port", "0",
        "--fabric", "fab0", "--exit-on-stdin-eof", "--delay-ns", "1000000",
        "--max-tensor-bytes", "4096", "--threads", "2",
    ]  # fmt: skip
    argv, _ = role_argv("ps", {}, {}, LINK_LOCAL, engine="native")
    assert argv[1:3] == ["--host", "[fe80::1%ib0]"]
    argv, _ = role_argv("worker", {}, {}, FABRIC, engine="native")
    assert argv == [str(tmp_path / "tfgrpc-native-worker")]
    argv, _ = role_argv("floor_server", {}, {}, LINK_LOCAL, engine="native")
    assert argv == [str(tmp_path / "tfgrpc-native-floor"), "serve", "--bind", "fe80::1%ib0",
                    "--port", "0"]  # fmt: skip


@pytest.mark.parametrize(
    ("role", "engine", "params", "message"),
    [
        ("tensor_server", "c++", {}, "engine 'c++': expected one of grpcio, native"),
        ("floor_server", "native", {"threads": "2"}, "its parameters: none"),
        ("ps", "native", {"workers": "8"}, "no parameter 'workers'"),
        ("ps", "native", {"threads": "65"}, "threads='65'"),
        ("ps", "native", {"delay": "11s"}, "delay='11s': from 0 to 10 s"),
    ],
)
def test_native_requests_outside_the_roles_are_refused(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    role: str,
    engine: str,
    params: dict[str, str],
    message: str,
) -> None:
    _built(monkeypatch, tmp_path)
    with pytest.raises(RoleError) as info:
        role_argv(role, params, {}, FABRIC, engine=engine)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert message in str(info.value)


def test_a_host_without_the_native_build_says_so_in_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from pytest_tfgrpc import native

    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path / "nothing-built"))
    with pytest.raises(RoleError) as info:
        role_argv("ps", {}, {}, FABRIC, engine="native", host="node7")
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert str(info.value) == (
        "host node7: the native engine is not built there, so it cannot run the native ps: "
        "run `tfgrpc-build-native` on node7 (or drop the native engine)"
    )
    assert engines_here() == ("grpcio",)


def test_roles_get_the_hosts_own_tls_files_and_only_when_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TFGRPC_TLS_CERT", "/agent/own/env.pem")  # never passed on as such
    files = TlsFiles("/etc/node/cert.pem", "/etc/node/key.pem", "/etc/node/ca.pem")
    _, env = role_argv("worker", {}, {}, FABRIC, tls=files)
    assert {k: v for k, v in env.items() if k.startswith("TFGRPC_TLS_")} == {
        "TFGRPC_TLS_CERT": "/etc/node/cert.pem",
        "TFGRPC_TLS_KEY": "/etc/node/key.pem",
        "TFGRPC_TLS_CA": "/etc/node/ca.pem",
    }
    for role, tls in (("worker", None), ("floor_server", files)):  # the floor is raw TCP
        _, env = role_argv(role, {}, {}, FABRIC, tls=tls)
        assert not [k for k in env if k.startswith("TFGRPC_TLS_")]


def test_a_tls_mismatch_names_the_host_and_the_fix() -> None:
    assert tls_mismatch("w3", "off", "mtls") == (
        "host w3: its agent gives the roles it starts TLS 'off', and this run uses 'mtls' "
        "(--tfgrpc-tls-*): start its tfgrpc-node with --tls-cert/--tls-key (and --tls-ca for "
        "mutual TLS)"
    )


class _Recorder:
    """An AgentClient stand-in that keeps what the launcher asked it to run."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, dict[str, str], dict[str, str], str, bool]] = []

    def run(self, role: str, params: Any, env: Any, stderr: Any, **kw: Any) -> None:
        self.asked.append((role, dict(params), dict(env), kw["engine"], kw["tls"]))


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (["/x/tfgrpc-native-server", "--host", "h", "--delay-ns", "1000", "--threads", "2"], {},
         ("tensor_server", {"delay": "1000ns", "threads": "2"}, {}, "native", False)),
        (["/x/tfgrpc-native-server", "--delay-ns", "0"], {"TFGRPC_JOB_TOKEN": "t" * 20},
         ("ps", {}, {"TFGRPC_JOB_TOKEN": "t" * 20}, "native", False)),
        (["/x/tfgrpc-native-worker"], {"TFGRPC_TLS_CERT": "/c.pem", "TFGRPC_JOB_TOKEN": "t" * 20},
         ("worker", {}, {"TFGRPC_JOB_TOKEN": "t" * 20}, "native", True)),
        (["/x/tfgrpc-native-floor", "serve", "--bind", "h", "--port", "0"], {},
         ("floor_server", {}, {}, "native", False)),
        ([sys.executable, "-m", "pytest_tfgrpc.roles.tensor_server", "--workers", "8"],
         {"TFGRPC_TLS_CA": "/ca.pem", "MALLOC_ARENA_MAX": "2"},
         ("ps", {"workers": "8"}, {"MALLOC_ARENA_MAX": "2"}, "grpcio", True)),
    ],
)  # fmt: skip
def test_the_launcher_names_the_role_engine_and_tls_and_passes_nothing_else(
    argv: list[str], env: dict[str, str], expected: tuple[Any, ...]
) -> None:
    from pytest_tfgrpc.hosts.agent_client import AgentLauncher

    client = _Recorder()
    AgentLauncher(client).spawn(argv, env=env, stderr=sys.stderr.buffer, name="x")  # type: ignore[arg-type]
    assert client.asked == [expected]


def test_the_agents_token_never_reaches_a_role(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TFGRPC_AGENT_TOKEN", "x" * 32)
    for role in ("tensor_server", "ps", "worker"):
        _, env = role_argv(role, {}, {}, FABRIC)
        assert "TFGRPC_AGENT_TOKEN" not in env
