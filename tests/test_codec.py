"""The hand-written TensorProto coding against the protobuf library, both ways."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_tfgrpc.wire import codec
from pytest_tfgrpc.wire._proto import service_pb2, tensor_pb2


@pytest.mark.parametrize(
    ("dtype", "shape"),
    [("float32", (3, 4)), ("uint8", (0,)), ("int64", (2, 0, 5)), ("float16", (1,)), ("bool", ())],
)
def test_hand_encoded_tensor_parses_as_tensorproto(dtype: str, shape: tuple[int, ...]) -> None:
    array = (np.arange(int(np.prod(shape)), dtype=np.int64) % 7).astype(dtype).reshape(shape)
    encoded = codec.encode_tensor(array.tobytes(), dtype, shape)
    proto = tensor_pb2.TensorProto.FromString(encoded)
    assert proto.dtype == codec.DTYPES[dtype]
    assert tuple(d.size for d in proto.tensor_shape.dim) == shape
    assert proto.tensor_content == array.tobytes()


def test_protobuf_encoded_tensor_decodes_by_hand() -> None:
    array = np.linspace(0, 1, 24, dtype=np.float32).reshape(2, 3, 4)
    proto = tensor_pb2.TensorProto(
        dtype=tensor_pb2.DT_FLOAT,
        tensor_shape=tensor_pb2.TensorShapeProto(
            dim=[
                tensor_pb2.TensorShapeProto.Dim(size=n, name=f"d{i}")
                for i, n in enumerate(array.shape)
            ]
        ),
        version_number=7,  # a field the decoder must skip
        tensor_content=array.tobytes(),
    )
    decoded = codec.decode_tensor(proto.SerializeToString())
    assert decoded.dtype == "float32"
    assert decoded.shape == (2, 3, 4)
    np.testing.assert_array_equal(decoded.to_numpy(), array)


def test_decode_does_not_copy_the_content() -> None:
    encoded = codec.encode_tensor(b"\x01" * 4096, "uint8", (4096,))
    decoded = codec.decode_tensor(encoded)
    assert decoded.content.obj is encoded


def test_content_span_reads_the_header_of_a_first_slice_only() -> None:
    content = bytes(range(256)) * 4096
    encoded = codec.encode_tensor(content, "float32", (len(content) // 4,))
    dtype, shape, offset, length = codec.content_span(encoded[:64])
    assert (dtype, shape, length) == ("float32", (len(content) // 4,), len(content))
    assert encoded[offset:] == content


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x08\x01", "no tensor_content"),
        (b"\x08\x63\x22\x01\x00", "unsupported dtype number 99"),
        (b"\x08\x01\x22\x08abcd", "claims 8 bytes"),
        (b"\x08\xff", "truncated"),
    ],
)
def test_malformed_tensors_say_what_is_wrong(data: bytes, message: str) -> None:
    with pytest.raises(codec.CodecError, match=message):
        codec.decode_tensor(data)


def test_shape_and_content_must_agree() -> None:
    with pytest.raises(codec.CodecError, match=r"shape \(3,\) of float32 needs 12 bytes"):
        codec.decode_tensor(codec.encode_tensor(b"\x00" * 8, "float32", (3,)))


def test_small_messages_match_the_generated_classes() -> None:
    ack_bytes = service_pb2.Ack(bytes_received=5 << 30, messages=3).SerializeToString()
    assert codec.decode_ack(ack_bytes) == (5 << 30, 3)
    ack = service_pb2.Ack.FromString(codec.encode_ack(123456789, 42))
    assert (ack.bytes_received, ack.messages) == (123456789, 42)
    pull_bytes = codec.encode_pull_request(1 << 26, "float32", 1 << 20)
    pull = service_pb2.PullRequest.FromString(pull_bytes)
    assert (pull.nbytes, pull.dtype, pull.chunk_bytes) == (1 << 26, tensor_pb2.DT_FLOAT, 1 << 20)
    assert codec.decode_pull_request(pull.SerializeToString()) == (1 << 26, "float32", 1 << 20)
    chunk = service_pb2.TensorChunk.FromString(codec.encode_chunk(memoryview(b"xyz" * 1000)))
    assert chunk.data == b"xyz" * 1000
    assert codec.chunk_data(chunk.SerializeToString()) == b"xyz" * 1000


def test_dtype_numbers_match_the_proto_enum() -> None:
    for name, number in codec.DTYPES.items():
        assert tensor_pb2.DataType.Name(number).lower().startswith("dt_"), name
    assert codec.DTYPES["float32"] == tensor_pb2.DT_FLOAT == 1
    assert codec.DTYPES["bfloat16"] == tensor_pb2.DT_BFLOAT16 == 14
    assert codec.DTYPES["float16"] == tensor_pb2.DT_HALF == 19


@pytest.mark.parametrize("chunk_bytes", [64, 1000, 4096, 1 << 20])
@pytest.mark.parametrize("nbytes", [0, 8, 5000, 300_000])
def test_chunks_concatenate_to_the_encoded_tensor(chunk_bytes: int, nbytes: int) -> None:
    content = bytes(np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8))
    chunks = codec.encode_tensor_chunks(content, "uint8", (nbytes,), chunk_bytes)
    datas = [service_pb2.TensorChunk.FromString(chunk).data for chunk in chunks]
    header = len(codec.encode_header("uint8", (nbytes,), nbytes))
    # the header rides on the first slice: as many messages as raw slices of the content
    assert len(chunks) == max(1, -(-nbytes // chunk_bytes))
    assert all(len(data) == chunk_bytes for data in datas[1:-1])
    assert len(datas[0]) == header + min(nbytes, chunk_bytes)
    assert b"".join(datas) == codec.encode_tensor(content, "uint8", (nbytes,))
