"""The committed generated code is what scripts/gen_protos.py makes from protos/, and the
dataclasses that mirror a message keep its fields."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "pytest_tfgrpc" / "wire" / "_proto"


def test_generated_code_matches_the_protos(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (the dev extra) regenerates the code")
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts" / "gen_protos.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    written = gen.generate(tmp_path / "_proto")
    names = sorted(path.name for path in written)
    assert names == sorted(path.name for path in COMMITTED.iterdir() if path.is_file())
    drifted = [p.name for p in written if p.read_text() != (COMMITTED / p.name).read_text()]
    assert not drifted, f"regenerate with `python scripts/gen_protos.py`: {drifted} drifted"


@pytest.mark.parametrize(
    ("state", "message", "renamed"),
    [
        ("TcpState", "TcpSocket", {}),
        ("LinkState", "InterfaceCounters", {"interface": "fabric"}),
        ("Reading", "TelemetryReply", {}),
    ],
)
def test_telemetry_states_and_the_agents_messages_carry_the_same_fields(
    state: str, message: str, renamed: dict[str, str]
) -> None:
    """The agent sends a reading as protobuf; the driver's own reader builds the dataclasses.
    A field added to one and not the other would be lost through agents only."""
    from pytest_tfgrpc.wire import telemetry
    from pytest_tfgrpc.wire._proto import agent_pb2

    fields = [renamed.get(f.name, f.name) for f in dataclasses.fields(getattr(telemetry, state))]
    assert fields == [f.name for f in getattr(agent_pb2, message).DESCRIPTOR.fields]
