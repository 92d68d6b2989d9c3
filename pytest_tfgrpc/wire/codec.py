"""Tensor encoding on the measuring path: TensorProto by hand, as TensorFlow does it.

TensorFlow's gRPC runtime does not run protobuf's serializer over tensor bytes
(``grpc_tensor_coding.cc``): it writes the few header fields of the ``TensorProto`` by
hand and lets the ``tensor_content`` bytes follow. This module does the same, so that
protobuf mode costs what TensorFlow's wire format costs and not what a generic
``SerializeToString`` of a multi-megabyte message costs. The bytes produced are an ordinary
``TensorProto`` (``tests/test_codec.py`` checks them against the protobuf library both ways).

Field numbers (TensorFlow's ``tensor.proto``): dtype = 1 (varint), tensor_shape = 2
(message; each ``dim`` is field 2 of it, with ``size`` = field 1), tensor_content = 4.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# DataType numbers as in TensorFlow's types.proto (and protos/tfgrpc/tensor.proto).
DTYPES: dict[str, int] = {
    "float32": 1,
    "float64": 2,
    "int32": 3,
    "uint8": 4,
    "int16": 5,
    "int8": 6,
    "complex64": 8,
    "int64": 9,
    "bool": 10,
    "bfloat16": 14,
    "uint16": 17,
    "complex128": 18,
    "float16": 19,
    "uint32": 22,
    "uint64": 23,
}
DTYPE_NAMES: dict[int, str] = {number: name for name, number in DTYPES.items()}
#: Bytes per element of each dtype (numpy has no bfloat16: its size is said here, once).
ITEMSIZES: dict[str, int] = {
    name: 2 if name == "bfloat16" else np.dtype(name).itemsize for name in DTYPES
}

_WIRE_VARINT = 0
_WIRE_I64 = 1
_WIRE_LEN = 2
_WIRE_I32 = 5


class CodecError(ValueError):
    """Bytes that are not the message they were taken for."""


def varint(value: int) -> bytes:
    """Protobuf base-128 varint of a non-negative integer."""
    if value < 0:
        raise CodecError(f"varint of a negative number: {value}")
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    end = len(buf)
    while pos < end:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            break
    raise CodecError("truncated or overlong varint")


def _field(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def _len_field(number: int, payload: bytes) -> bytes:
    return _field(number, _WIRE_LEN) + varint(len(payload)) + payload


def encode_header(dtype: str, shape: tuple[int, ...], content_bytes: int) -> bytes:
    """Everything of an encoded ``TensorProto`` that precedes its content bytes.

    ``header + content`` is a complete TensorProto whose ``tensor_content`` is ``content``.
    """
    number = DTYPES.get(dtype)
    if number is None:
        known = ", ".join(sorted(DTYPES))
        raise CodecError(f"dtype {dtype!r} has no TensorFlow DataType here; known: {known}")
    dims = b"".join(
        _len_field(2, _field(1, _WIRE_VARINT) + varint(size) if size else b"") for size in shape
    )
    return (
        _field(1, _WIRE_VARINT)
        + varint(number)
        + _len_field(2, dims)
        + _field(4, _WIRE_LEN)
        + varint(content_bytes)
    )


def encode_tensor(content: bytes | memoryview, dtype: str, shape: tuple[int, ...]) -> bytes:
    """One encoded TensorProto: the hand-written header, then the content (one copy)."""
    return b"".join((encode_header(dtype, shape, len(content)), content))


@dataclass(frozen=True, eq=False)
class DecodedTensor:
    """A TensorProto read without copying its content: ``content`` views the input bytes."""

    dtype: str
    shape: tuple[int, ...]
    content: memoryview

    def to_numpy(self) -> np.ndarray:
        """The tensor as a read-only numpy array over the received bytes (no copy)."""
        return np.frombuffer(self.content, dtype=self.dtype).reshape(self.shape)


def _skip(buf: memoryview, pos: int, wire: int) -> int:
    if wire == _WIRE_VARINT:
        return _read_varint(buf, pos)[1]
    if wire == _WIRE_I64:
        return pos + 8
    if wire == _WIRE_I32:
        return pos + 4
    if wire == _WIRE_LEN:
        length, pos = _read_varint(buf, pos)
        return pos + length
    raise CodecError(f"unsupported wire type {wire}")


def _decode_shape(buf: memoryview) -> tuple[int, ...]:
    dims: list[int] = []
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 2 and wire == _WIRE_LEN:
            length, pos = _read_varint(buf, pos)
            dim = buf[pos : pos + length]
            pos += length
            size = 0
            dpos = 0
            while dpos < len(dim):
                dkey, dpos = _read_varint(dim, dpos)
                if dkey == (1 << 3 | _WIRE_VARINT):
                    size, dpos = _read_varint(dim, dpos)
                else:
                    dpos = _skip(dim, dpos, dkey & 7)
            dims.append(size)
        else:
            pos = _skip(buf, pos, wire)
    return tuple(dims)


def content_span(data: bytes | memoryview) -> tuple[str, tuple[int, ...], int, int]:
    """Parse a TensorProto's fields up to its content: (dtype, shape, offset, length).

    ``data`` may be only the start of the message (the first slice of a streamed tensor), as
    long as it holds every field before ``tensor_content``'s length. Unknown fields are skipped.
    """
    buf = memoryview(data)
    pos = 0
    dtype_number = 0
    shape: tuple[int, ...] = ()
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 1 and wire == _WIRE_VARINT:
            dtype_number, pos = _read_varint(buf, pos)
        elif number == 2 and wire == _WIRE_LEN:
            length, pos = _read_varint(buf, pos)
            shape = _decode_shape(buf[pos : pos + length])
            pos += length
        elif number == 4 and wire == _WIRE_LEN:
            length, pos = _read_varint(buf, pos)
            dtype = DTYPE_NAMES.get(dtype_number)
            if dtype is None:
                raise CodecError(f"TensorProto with unsupported dtype number {dtype_number}")
            return dtype, shape, pos, length
        else:
            pos = _skip(buf, pos, wire)
    raise CodecError("no tensor_content in the TensorProto bytes given")


def decode_tensor(data: bytes | memoryview) -> DecodedTensor:
    """Decode a whole encoded TensorProto; the content is a view, not a copy."""
    dtype, shape, offset, length = content_span(data)
    buf = memoryview(data)
    if offset + length != len(buf):
        raise CodecError(
            f"TensorProto content claims {length} bytes at offset {offset}, message has {len(buf)}"
        )
    expected = math.prod(shape) * ITEMSIZES[dtype] if shape else length
    if expected != length:
        raise CodecError(f"shape {shape} of {dtype} needs {expected} bytes, content has {length}")
    return DecodedTensor(dtype, shape, buf[offset:])


def encode_ack(bytes_received: int, messages: int) -> bytes:
    """An encoded ``tfgrpc.Ack`` (bytes_received = 1, messages = 2)."""
    return (
        _field(1, _WIRE_VARINT)
        + varint(bytes_received)
        + _field(2, _WIRE_VARINT)
        + varint(messages)
    )


def _varint_fields(data: bytes, defaults: dict[int, int]) -> dict[int, int]:
    """The varint fields numbered in ``defaults`` of a message (other fields skipped)."""
    buf = memoryview(data)
    pos = 0
    fields = dict(defaults)
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        if key & 7 == _WIRE_VARINT and key >> 3 in fields:
            fields[key >> 3], pos = _read_varint(buf, pos)
        else:
            pos = _skip(buf, pos, key & 7)
    return fields


def decode_ack(data: bytes) -> tuple[int, int]:
    """(bytes_received, messages) of an encoded ``tfgrpc.Ack``."""
    fields = _varint_fields(data, {1: 0, 2: 0})
    return fields[1], fields[2]


def encode_chunk(data: bytes | memoryview) -> bytes:
    """An encoded ``tfgrpc.TensorChunk`` around ``data`` (one copy of ``data``)."""
    return b"".join((_field(1, _WIRE_LEN), varint(len(data)), data))


class ChunkedTensor:
    """A tensor to stream as ``TensorChunk`` messages: one encoded TensorProto in slices.

    The content slices are wrapped once, when the tensor is made, as TensorFlow's send path
    hands gRPC the tensor's existing buffer; :meth:`chunks` encodes the TensorProto header
    for every message sent and puts it in front of the first slice. The slices' data,
    concatenated, is exactly ``encode_tensor(content, dtype, shape)``; the header rides on
    top of the first slice, so a tensor takes as many messages as its raw slices do.
    """

    def __init__(
        self, content: bytes | memoryview, dtype: str, shape: tuple[int, ...], chunk_bytes: int
    ) -> None:
        view = memoryview(content)
        self.dtype = dtype
        self.shape = shape
        self.nbytes = len(view)
        self._first = view[:chunk_bytes]
        self._rest = [
            encode_chunk(view[start : start + chunk_bytes])
            for start in range(chunk_bytes, len(view), chunk_bytes)
        ]

    def chunks(self) -> list[bytes]:
        """The messages of one send: the header is encoded now."""
        header = encode_header(self.dtype, self.shape, self.nbytes)
        size = len(header) + len(self._first)
        first = b"".join((_field(1, _WIRE_LEN), varint(size), header, self._first))
        return [first, *self._rest]


def encode_tensor_chunks(
    content: bytes | memoryview, dtype: str, shape: tuple[int, ...], chunk_bytes: int
) -> list[bytes]:
    """One TensorProto encoded straight into ``TensorChunk`` messages (see
    :class:`ChunkedTensor`): each content byte is copied once, into its chunk."""
    return ChunkedTensor(content, dtype, shape, chunk_bytes).chunks()


def chunk_data(message: bytes) -> memoryview:
    """The ``data`` field of an encoded ``tfgrpc.TensorChunk``, as a view."""
    buf = memoryview(message)
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        if key == (1 << 3 | _WIRE_LEN):
            length, pos = _read_varint(buf, pos)
            return buf[pos : pos + length]
        pos = _skip(buf, pos, key & 7)
    return buf[0:0]


def encode_pull_request(nbytes: int, dtype: str, chunk_bytes: int) -> bytes:
    """An encoded ``tfgrpc.PullRequest``."""
    return (
        _field(1, _WIRE_VARINT)
        + varint(nbytes)
        + _field(2, _WIRE_VARINT)
        + varint(DTYPES[dtype])
        + _field(3, _WIRE_VARINT)
        + varint(chunk_bytes)
    )


def decode_pull_request(data: bytes) -> tuple[int, str, int]:
    """(nbytes, dtype, chunk_bytes) of an encoded ``tfgrpc.PullRequest``."""
    fields = _varint_fields(data, {1: 0, 2: DTYPES["uint8"], 3: 0})
    dtype = DTYPE_NAMES.get(fields[2])
    if dtype is None:
        raise CodecError(f"PullRequest with unsupported dtype number {fields[2]}")
    return fields[1], dtype, fields[3]
