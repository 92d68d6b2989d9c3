"""Tensor payloads: the bytes a benchmark sends, and how they look on the wire per mode."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pytest_tfgrpc.wire import codec

#: Content is random, not zeros, so that nothing on the path can compress it away.
DEFAULT_SEED = 20180401


def make_content(
    nbytes: int, *, dtype: str = "float32", seed: int = DEFAULT_SEED
) -> tuple[bytes, str, tuple[int, ...]]:
    """``nbytes`` of seeded random tensor content: (bytes, dtype, shape).

    A size that is not a whole number of ``dtype`` elements is sent as a ``uint8`` tensor.
    """
    if nbytes < 0:
        raise ValueError(f"a tensor cannot have {nbytes} bytes")
    itemsize = np.dtype(dtype).itemsize
    if nbytes % itemsize:
        dtype, itemsize = "uint8", 1
    content = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8).tobytes()
    return content, dtype, (nbytes // itemsize,)


@dataclass(frozen=True, eq=False)
class Tensor:
    """One tensor to send: its content, dtype and shape."""

    content: bytes
    dtype: str
    shape: tuple[int, ...]

    @classmethod
    def random(cls, nbytes: int, *, dtype: str = "float32", seed: int = DEFAULT_SEED) -> Tensor:
        return cls(*make_content(nbytes, dtype=dtype, seed=seed))

    @property
    def nbytes(self) -> int:
        return len(self.content)

    def wire_bytes(self, mode: str) -> int:
        """Size of one encoded message of this tensor in ``mode``."""
        if mode == "raw":
            return self.nbytes
        return len(codec.encode_header(self.dtype, self.shape, self.nbytes)) + self.nbytes
