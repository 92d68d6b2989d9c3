"""TensorFlow's engine: TensorProto interop with TensorFlow itself both ways, and a suite that
measures the grpcio and TensorFlow engines side by side on one fabric, in one JUnit file.

Needs the ``tensorflow`` extra; without it these tests skip with that reason (the engine's
own skip is tested in test_engines.py)."""

from __future__ import annotations

import importlib.util
from importlib import metadata

import pytest
from junitparser.xunit2 import JUnitXml

if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("the tensorflow extra is not installed", allow_module_level=True)

# TensorFlow is imported only in subprocesses: it carries its own protobuf and gRPC, and a
# pytest process that has loaded it crashes later in grpc_tools' protoc (test_proto_sync).
INTEROP = """
import numpy as np
import pytest
import tensorflow as tf

from pytest_tfgrpc.wire import codec
from pytest_tfgrpc.wire._proto import tensor_pb2

ARRAYS: list[np.ndarray] = [
    np.arange(6, dtype=np.float32).reshape(2, 3),
    np.array([[-(2**40), 7]], dtype=np.int64),
    np.frombuffer(bytes(range(256)), dtype=np.uint8).reshape(4, 8, 8),
    np.linspace(-1, 1, 1000).astype(np.float16),
    np.array([True, False, True]),
    np.random.default_rng(1).standard_normal((3, 5, 7)).astype(np.float64),
]
IDS = [f"{a.dtype}{list(a.shape)}" for a in ARRAYS]


def _tf_dtype(array: np.ndarray) -> object:
    return tf.as_dtype(array.dtype)


#: dtypes whose TensorProto TensorFlow's Python helper (make_tensor_proto) writes as
#: tensor_content; it writes the others (bool, float16) as typed repeated fields (bool_val,
#: half_val), which the plugin's codec does not read (TensorFlow's runtime, in C++, always
#: sends tensor_content: that is what the first test checks for every dtype).
PY_TENSOR_CONTENT = {"float32", "float64", "int64", "uint8"}


def _written_by_tensorflow(array: np.ndarray) -> list[bytes]:
    out = [tf.io.serialize_tensor(tf.constant(array)).numpy()]  # C++: SerializeTensor
    if str(array.dtype) in PY_TENSOR_CONTENT:
        out.append(tf.make_tensor_proto(array).SerializeToString())
    return out


def test_typed_value_fields_are_refused_not_misread() -> None:
    data = tf.make_tensor_proto(np.array([True, False])).SerializeToString()
    with pytest.raises(codec.CodecError, match="no tensor_content"):
        codec.decode_tensor(data)


@pytest.mark.parametrize("array", ARRAYS, ids=IDS)
def test_tensorflow_tensorproto_parses_with_the_plugins(array: np.ndarray) -> None:
    for data in _written_by_tensorflow(array):
        decoded = codec.decode_tensor(data)
        assert decoded.dtype == str(array.dtype)
        assert decoded.shape == array.shape
        np.testing.assert_array_equal(decoded.to_numpy().reshape(array.shape), array)
        message = tensor_pb2.TensorProto.FromString(data)
        assert message.tensor_content == array.tobytes()
        assert tuple(d.size for d in message.tensor_shape.dim) == array.shape


@pytest.mark.parametrize("array", ARRAYS, ids=IDS)
def test_plugin_tensorproto_parses_in_tensorflow(array: np.ndarray) -> None:
    data = codec.encode_tensor(array.tobytes(), str(array.dtype), array.shape)
    # TensorFlow's C++ parser (ParseTensor) and its Python TensorProto.
    parsed = tf.io.parse_tensor(data, out_type=_tf_dtype(array)).numpy()
    np.testing.assert_array_equal(parsed, array)
    proto = tf.make_tensor_proto(array)
    proto.ParseFromString(data)
    np.testing.assert_array_equal(tf.make_ndarray(proto), array)
    # The same bytes through the plugin's generated TensorProto message.
    message = tensor_pb2.TensorProto.FromString(data)
    np.testing.assert_array_equal(
        tf.io.parse_tensor(message.SerializeToString(), out_type=_tf_dtype(array)).numpy(), array
    )
"""


def test_tensorproto_interop_with_tensorflow_both_ways(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_interop=INTEROP)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=13)


SIDE_BY_SIDE = """
import pytest

pytestmark = [pytest.mark.tfgrpc_engines("grpcio", "tensorflow"),
              pytest.mark.tfgrpc_run(iterations=20, warmup=2, max_seconds=3)]

@pytest.mark.message_profile(["1KiB", "1MiB", "4MiB"])
def test_p2p(tfgrpc, tensor_server):
    tfgrpc.p2p_latency(tensor_server, label="echo")
    tfgrpc.p2p_bandwidth(tensor_server, label="push")
    tfgrpc.p2p_bandwidth(tensor_server, direction="pull", rpc="unary", label="pull")

@pytest.mark.message_profile("resnet50", scale=0.01)
@pytest.mark.ps_topology(ps=2, workers=1)
def test_ps(tfgrpc, ps_cluster):
    result = tfgrpc.ps_throughput(ps_cluster)
    assert result.placement is not None and result.placement.ps == 2
"""


def test_grpcio_and_tensorflow_side_by_side_in_one_junit_file(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_side=SIDE_BY_SIDE)
    xml = pytester.path / "both.xml"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--junitxml={xml}")
    result.assert_outcomes(passed=4)
    cases = {
        case.name: {p.name: p.value for p in case.properties()}  # type: ignore[attr-defined]
        for suite in JUnitXml.fromfile(str(xml))
        for case in suite
    }
    assert set(cases) == {
        f"test_{t}[lo-{e}]" for t in ("p2p", "ps") for e in ("grpcio", "tensorflow")
    }
    for engine in ("grpcio", "tensorflow"):
        props = cases[f"test_p2p[lo-{engine}]"]
        for label in ("echo", "push", "pull"):
            assert f"engine={engine}" in props[f"tfgrpc.{label}.settings"]
            for size in ("1KiB", "1MiB", "4MiB"):
                assert float(props[f"tfgrpc.{label}.{size}.p50_us"]) > 0
                assert int(props[f"tfgrpc.{label}.{size}.samples"]) >= 1
        ps = cases[f"test_ps[lo-{engine}]"]
        assert ps["tfgrpc.ps_throughput.topology"] == "2ps_1workers_round_robin"
        assert float(ps["tfgrpc.ps_throughput.resnet50-scale_0p01.throughput_MBps"]) > 0
    tf_settings = cases["test_p2p[lo-tensorflow]"]["tfgrpc.pull.settings"]
    assert f"tensorflow={_tf_version()}" in tf_settings
    assert "tf_step_overhead_p50_ns=" in tf_settings
    assert cases["test_p2p[lo-tensorflow]"]["tfgrpc.pull.rpc"] == "RecvTensor"


def test_tensorflow_engine_refuses_what_it_cannot_measure(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        pytestmark = pytest.mark.tfgrpc_engines("tensorflow")

        @pytest.mark.ps_topology(ps=1, workers=2)
        def test_two_workers(tfgrpc, ps_cluster):
            pass

        @pytest.mark.message_profile("hep_cnn")
        def test_steps(tfgrpc, ps_cluster):
            tfgrpc.sync_sgd_step(ps_cluster)

        def test_payload(tfgrpc, tensor_server):
            tfgrpc.p2p_bandwidth(tensor_server, sizes=0, iterations=2)
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=2, errors=1)
    out = result.stdout.str()
    assert "TensorFlow's engine runs one worker task" in out
    assert "sync_sgd_step() runs on the plugin's own PS processes" in out
    assert "engine 'tensorflow' moves tensors of at least 1 byte" in out


def _tf_version() -> str:
    for distribution in ("tensorflow-cpu", "tensorflow"):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    raise AssertionError("tensorflow is importable but no distribution says its version")
