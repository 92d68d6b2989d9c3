"""Parameter-server topology, and how a model's tensors are placed on the PS tasks.

A :class:`Topology` says how many PS tasks and workers a test runs and which sharding strategy
places the tensors. :func:`place` turns a list of tensors into a :class:`Placement`: which PS
owns which tensor (or which slice of one), the bytes each PS holds, and the load imbalance
(busiest PS bytes / mean PS bytes), which is what limits a synchronous step: every worker waits
for the slowest PS.

The strategies follow TensorFlow's ``tf.compat.v1.train.replica_device_setter``:

* ``round_robin``: its default ``_RoundRobinStrategy``; variables in creation order go to
  PS 0, 1, ..., P-1, 0, 1, ... whatever their size. The order counts every variable the
  framework creates, exchanged or not: a profile with ``slots`` (tf_cnn_benchmarks' models,
  whose ``global_step`` and batch-norm moving statistics take turns too) places tensor ``i``
  on PS ``slots[i] % P``; without slots a tensor's index in the profile is its slot.
* ``greedy``: ``GreedyLoadBalancingStrategy`` with ``byte_size_load_fn``; each tensor, in
  declaration order (TensorFlow does not sort them by size), goes to the PS with the fewest
  bytes so far, the lowest task index on a tie.
* ``partitioned``: tensors larger than ``partition_bytes`` are split along their leading
  dimension into near-equal slices, as ``tf.compat.v1.min_max_variable_partitioner(
  max_partitions=P, min_slice_size=partition_bytes)`` does; each slice is a variable of its
  own, and all of them are placed round-robin, so the slices of one tensor land on distinct
  PS tasks.

Mathuriya et al. (arXiv:1712.09388) traced poor scaling of ResNet-50 on Cori partly to this:
once PS tasks outnumber the large tensors, whole-tensor placement cannot balance the bytes,
and only partitioning keeps the imbalance near 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_tfgrpc.model.profiles import Profile

__all__ = [
    "DEFAULT_PARTITION_BYTES",
    "SHARDINGS",
    "Placement",
    "Shard",
    "Topology",
    "place",
    "place_profile",
    "placed_on",
]

SHARDINGS = ("round_robin", "greedy", "partitioned")

#: ``min_max_variable_partitioner``'s default ``min_slice_size`` (256 KiB).
DEFAULT_PARTITION_BYTES = 256 << 10


def _check_count(name: str, value: object, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}={value!r}: the number of {what} must be a whole number")
    if value < 1:
        raise ValueError(f"{name}={value!r}: a topology needs at least one of its {what}")


def _check_sharding(value: object) -> None:
    if value not in SHARDINGS:
        raise ValueError(
            f"sharding={value!r}: unknown sharding strategy; known: {', '.join(SHARDINGS)}"
        )


@dataclass(frozen=True)
class Topology:
    """``ps`` parameter-server tasks, ``workers`` worker tasks, and the sharding strategy."""

    ps: int
    workers: int
    sharding: str = "round_robin"

    def __post_init__(self) -> None:
        _check_count("ps", self.ps, "parameter servers")
        _check_count("workers", self.workers, "workers")
        _check_sharding(self.sharding)


@dataclass(frozen=True)
class Shard:
    """A tensor, or the slice ``[offset, offset + nbytes)`` of its bytes, owned by PS ``ps``."""

    tensor: str
    ps: int
    nbytes: int
    offset: int = 0

    @property
    def key(self) -> str:
        """A name unique within a placement: the tensor name, with the offset of a slice."""
        return self.tensor if self.offset == 0 else f"{self.tensor}@{self.offset}"


@dataclass(frozen=True)
class Placement:
    """Where every tensor lives: ``shards`` in placement order over ``ps`` PS tasks."""

    ps: int
    sharding: str
    shards: tuple[Shard, ...]

    def __post_init__(self) -> None:
        _check_count("ps", self.ps, "parameter servers")
        _check_sharding(self.sharding)
        for shard in self.shards:
            if not 0 <= shard.ps < self.ps:
                raise ValueError(f"shard {shard} is on PS {shard.ps}, outside 0..{self.ps - 1}")

    def bytes_per_ps(self) -> tuple[int, ...]:
        """Bytes each PS task owns, indexed by task."""
        loads = [0] * self.ps
        for shard in self.shards:
            loads[shard.ps] += shard.nbytes
        return tuple(loads)

    @property
    def total_bytes(self) -> int:
        return sum(shard.nbytes for shard in self.shards)

    @property
    def imbalance(self) -> float:
        """Busiest PS bytes / mean PS bytes: 1.0 is perfect, ``ps`` is all on one task.

        The mean counts every task, idle ones included: an idle PS is capacity wasted.
        """
        total = self.total_bytes
        if total == 0:
            return 1.0
        return max(self.bytes_per_ps()) * self.ps / total

    def shards_of(self, ps: int) -> tuple[Shard, ...]:
        """The shards PS task ``ps`` owns, in placement order."""
        if not 0 <= ps < self.ps:
            raise ValueError(f"ps={ps}: this placement has PS tasks 0..{self.ps - 1}")
        return tuple(shard for shard in self.shards if shard.ps == ps)


def _slices(nbytes: int, parts: int, align: int) -> list[tuple[int, int]]:
    """(offset, nbytes) of ``parts`` near-equal slices, cut on ``align``-byte boundaries."""
    units = math.ceil(nbytes / align)
    bounds = [min(nbytes, (units * i // parts) * align) for i in range(parts)] + [nbytes]
    return [(bounds[i], bounds[i + 1] - bounds[i]) for i in range(parts)]


def place(
    tensors: Sequence[tuple[str, int]],
    ps: int,
    sharding: str,
    *,
    partition_bytes: int = DEFAULT_PARTITION_BYTES,
    align: int = 4,
    slots: Sequence[int] | None = None,
) -> Placement:
    """Place ``(name, nbytes)`` tensors, in declaration order, on ``ps`` PS tasks.

    ``round_robin`` and ``greedy`` place whole tensors (see the module docstring).
    ``partitioned`` splits a tensor of more than ``partition_bytes`` into
    ``min(ps, ceil(nbytes / partition_bytes))`` slices (the ``min_max_variable_partitioner``
    rule, which keeps every slice at least about ``partition_bytes``), cut on ``align``-byte
    boundaries (the item size, so a slice holds whole elements) with sizes differing by at
    most one ``align`` unit; slices and small tensors then go round-robin. ``slots``: each
    tensor's index in the framework's variable-creation order, for ``round_robin`` (default:
    its index in ``tensors``).
    """
    _check_count("ps", ps, "parameter servers")
    _check_sharding(sharding)
    if partition_bytes < 1:
        raise ValueError(f"partition_bytes={partition_bytes!r}: must be at least 1 byte")
    if align < 1:
        raise ValueError(f"align={align!r}: must be at least 1 byte")
    seen: set[str] = set()
    for name, nbytes in tensors:
        if name in seen:
            raise ValueError(f"tensor {name!r} is listed twice")
        seen.add(name)
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"tensor {name!r}: nbytes={nbytes!r} is not a byte count")
    shards: list[Shard] = []
    if slots is not None and len(slots) != len(tensors):
        raise ValueError(f"slots: {len(slots)} slots for {len(tensors)} tensors")
    if sharding == "round_robin":
        order = slots if slots is not None else range(len(tensors))
        shards = [
            Shard(name, slot % ps, nbytes)
            for slot, (name, nbytes) in zip(order, tensors, strict=True)
        ]
    elif sharding == "greedy":
        loads = [0] * ps
        for name, nbytes in tensors:
            task = min(range(ps), key=loads.__getitem__)  # first minimum, as np.argmin
            loads[task] += nbytes
            shards.append(Shard(name, task, nbytes))
    else:
        task = 0
        for name, nbytes in tensors:
            parts = 1
            if nbytes > partition_bytes:
                parts = min(ps, math.ceil(nbytes / partition_bytes), math.ceil(nbytes / align))
            for offset, size in _slices(nbytes, parts, align):
                shards.append(Shard(name, task, size, offset))
                task = (task + 1) % ps
    return Placement(ps=ps, sharding=sharding, shards=tuple(shards))


def place_profile(
    profile: Profile,
    ps: int,
    sharding: str,
    *,
    partition_bytes: int = DEFAULT_PARTITION_BYTES,
) -> Placement:
    """:func:`place` a model profile's tensors; slices keep whole elements of every dtype."""
    align = math.lcm(*(spec.itemsize for spec in profile.tensors))
    tensors = [(spec.name, spec.nbytes) for spec in profile.tensors]
    return place(
        tensors, ps, sharding, partition_bytes=partition_bytes, align=align, slots=profile.slots
    )


def placed_on(
    profile: Profile,
    topology: Topology,
    placement: Placement | None = None,
    *,
    partition_bytes: int = DEFAULT_PARTITION_BYTES,
) -> Placement:
    """``profile`` placed on ``topology``'s PS tasks by its sharding, or ``placement`` when
    the caller already made it (so a test places its profile once and hands it down).

    Raises ValueError when ``placement`` is over other PS tasks or another sharding.
    """
    if placement is None:
        return place_profile(
            profile, topology.ps, topology.sharding, partition_bytes=partition_bytes
        )
    if (placement.ps, placement.sharding) != (topology.ps, topology.sharding):
        raise ValueError(
            f"placement: {placement.ps} PS tasks by {placement.sharding} for a topology of "
            f"{topology.ps} PS tasks by {topology.sharding}"
        )
    return placement
