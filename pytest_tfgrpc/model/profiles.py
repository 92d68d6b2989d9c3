"""Model profiles: the trainable tensors a training step exchanges with parameter servers.

A :class:`Profile` is a named tuple of :class:`TensorSpec` (name, shape, dtype). Built-in profiles
are computed from the published architectures in :mod:`pytest_tfgrpc.model.architectures`; users
bring
their own as a JSON file, a mapping of names to arrays or shapes, or a PyTorch / Keras model. All of
them go through :func:`load_profile`.

Built-in profiles list trainable tensors only, float32, in the reference implementation's
registration order. BatchNorm/LayerNorm ``gamma`` and ``beta`` are trainable and included; moving
means and variances are not parameters and are left out, which is how torchvision counts (and what
PyTorch's ``named_parameters()`` yields).

This module imports neither PyTorch nor TensorFlow: models are recognised by their API.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pytest_tfgrpc.model import architectures

__all__ = ["Profile", "Scaling", "TensorSpec", "list_profiles", "load_profile"]

# Frameworks use bfloat16, which numpy lacks; its size is all a profile needs.
_EXTRA_ITEMSIZES: dict[str, int] = {"bfloat16": 2}


def _canonical_dtype(dtype: str) -> tuple[str, int]:
    """Return the canonical name and item size of a numeric dtype name, or raise ValueError."""
    if dtype in _EXTRA_ITEMSIZES:
        return dtype, _EXTRA_ITEMSIZES[dtype]
    try:
        resolved = np.dtype(dtype)
    except TypeError:
        resolved = None
    if resolved is None or resolved.kind not in "biufc":
        known = "bool, int8..int64, uint8..uint64, float16, bfloat16, float32, float64, complex64"
        raise ValueError(f"unknown dtype {dtype!r} (expected a numeric dtype: {known})")
    return resolved.name, resolved.itemsize


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a profile.

    ``name`` is a variable path (``"conv1/kernel"``), ``shape`` a tuple of non-negative ints and
    ``dtype`` a numeric numpy dtype name (``"float32"``, also ``"bfloat16"``); aliases such as
    ``"f4"`` are normalised to the canonical name.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"tensor name must be a non-empty string, got {self.name!r}")
        shape = self.shape
        if isinstance(shape, (str, bytes)) or not isinstance(shape, Iterable):
            raise ValueError(f"shape must be a sequence of integers, got {shape!r}")
        dims = tuple(shape)
        for dim in dims:
            # bool is an int subclass, and numpy integers are not ints: check explicitly.
            if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
                raise ValueError(f"shape {list(dims)!r}: dimension {dim!r} is not an integer")
            if dim < 0:
                raise ValueError(f"shape {list(dims)!r}: negative dimension {int(dim)}")
        if not isinstance(self.dtype, str):
            raise ValueError(f"dtype must be a string, got {self.dtype!r}")
        object.__setattr__(self, "shape", tuple(int(d) for d in dims))
        object.__setattr__(self, "dtype", _canonical_dtype(self.dtype)[0])

    @property
    def num_elements(self) -> int:
        """Number of elements (1 for a scalar)."""
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return _canonical_dtype(self.dtype)[1]

    @property
    def kind(self) -> str:
        """What the tensor is, read from its name's last part and its shape, whatever the
        naming style (Keras ``conv1/kernel:0``, TensorFlow ``res2a_branch2a/kernel``, PyTorch
        ``layer1.0.conv1.weight``, ``conv1_w``): ``conv`` (a kernel of 3 or more
        dimensions), ``embedding`` (a table whose name says so), ``dense`` (a 2-D kernel),
        ``norm`` (a normalization's scale, offset or statistics), ``bias``, else ``other``."""
        path = re.split(r"[/.]", self.name.split(":")[0].lower())
        last = path[-1]
        if last not in _NORM_PARTS:  # conv1_w, fc1_b: the role after the last underscore
            last = last.rsplit("_", 1)[-1]
        if "embed" in self.name.lower() and len(self.shape) == 2:
            return "embedding"
        if last in _NORM_PARTS or (last == "weight" and len(self.shape) == 1):
            return "norm"
        if last in ("kernel", "weight", "weights", "w"):
            if len(self.shape) >= 3:
                return "conv"
            if len(self.shape) == 2:
                return "dense"
        if last in ("bias", "biases", "b"):
            return "bias"
        return "other"

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor's content: elements times item size."""
        return self.num_elements * self.itemsize


#: The last name parts of a normalization layer's tensors (Keras, TensorFlow, PyTorch).
_NORM_PARTS = frozenset(
    ("gamma", "beta", "moving_mean", "moving_variance", "running_mean", "running_var")
)
_UNSAFE_IN_KEY = re.compile(r"[^A-Za-z0-9_-]+")
_SCALED_NAME = re.compile(r"^(?P<base>[^\[\]]*)\[(?P<steps>[^\[\]]*)\]$")


def profile_key(name: str) -> str:
    """A profile's name as labels spell it everywhere (JUnit property names, the terminal
    summary, plots, the HTML report): letters, digits, ``_`` and ``-`` only, so that CI tools
    split ``tfgrpc.<label>.<key>.<metric>`` on dots safely. A scaled profile's steps follow its
    base name, each as ``-<step>_<value>`` with a decimal point written ``p``:
    ``resnet50[filter=conv,scale=0.05]`` -> ``resnet50-filter_conv-scale_0p05``."""
    match = _SCALED_NAME.match(name)
    base, steps = (match["base"], match["steps"].split(",")) if match else (name, [])
    parts = [_key_part(base)]
    for step in steps:
        argument, _, value = step.partition("=")
        parts.append(f"{_key_part(argument)}_{_key_part(value)}" if value else _key_part(step))
    return "-".join(part for part in parts if part) or "profile"


def _key_part(text: str) -> str:
    return _UNSAFE_IN_KEY.sub("_", text.replace(".", "p")).strip("_")


#: The tensor kinds a ``name_filter`` may name (:attr:`TensorSpec.kind`).
TENSOR_KINDS = ("conv", "dense", "norm", "bias", "embedding", "other")


@dataclass(frozen=True)
class Scaling:
    """How a profile was derived from another by :meth:`Profile.scaled`.

    ``base`` names the original profile; ``original_tensors`` and ``original_bytes`` give its size,
    so reports can say what fraction of the real model a quick run exchanged.
    """

    base: str
    original_tensors: int
    original_bytes: int
    name_filter: str | None = None
    max_tensors: int | None = None
    scale: float | None = None

    def describe(self) -> str:
        """The steps in the order they were applied, e.g. ``"max_tensors=10,scale=0.01"``."""
        parts: list[str] = []
        if self.name_filter is not None:
            parts.append(f"filter={self.name_filter}")
        if self.max_tensors is not None:
            parts.append(f"max_tensors={self.max_tensors}")
        if self.scale is not None:
            parts.append(f"scale={self.scale:g}")
        return ",".join(parts)


def _scaled_shape(shape: tuple[int, ...], scale: float) -> tuple[int, ...]:
    # Shrink from the leading dimension on, keeping trailing ones whole where possible, so the
    # element count lands near scale * elements; never below one element.
    elements = math.prod(shape)
    if elements == 0 or not shape:
        return shape
    target = max(1, round(elements * scale))
    new: list[int] = []
    for index, dim in enumerate(shape):
        rest = math.prod(shape[index + 1 :])
        if rest <= target:
            new.append(max(1, min(dim, round(target / rest))))
            new.extend(shape[index + 1 :])
            return tuple(new)
        new.append(1)
    return tuple(new)  # unreachable: the last dimension has rest == 1 <= target


@dataclass(frozen=True)
class Profile:
    """The tensors one training step exchanges, with where their layout comes from.

    ``source`` names the reference the layout follows (``"torchvision.models.resnet50
    (weights=None)"``, a file path, ``"mapping"``); ``scaling`` is ``None`` for a full profile and
    records what :meth:`scaled` did otherwise. Tensor names are unique.

    ``slots``, when given, holds each tensor's index in the framework's variable-creation order,
    which also counts variables that are not exchanged (TensorFlow's ``global_step``, batch
    norm's moving statistics): ``replica_device_setter``'s round robin places variable ``i`` on
    PS ``i % P``, so the ``round_robin`` sharding places a tensor by its slot. None: the
    tensors' own order is the creation order.
    """

    name: str
    tensors: tuple[TensorSpec, ...]
    source: str = ""
    scaling: Scaling | None = field(default=None)
    slots: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        tensors = tuple(self.tensors)
        if not tensors:
            raise ValueError(f"profile {self.name!r} has no tensors")
        first_at: dict[str, int] = {}
        for index, spec in enumerate(tensors):
            if not isinstance(spec, TensorSpec):
                raise ValueError(f"profile {self.name!r}: tensor #{index} is not a TensorSpec")
            if spec.name in first_at:
                raise ValueError(
                    f"profile {self.name!r}: duplicate tensor name {spec.name!r} "
                    f"(tensors #{first_at[spec.name]} and #{index})"
                )
            first_at[spec.name] = index
        object.__setattr__(self, "tensors", tensors)
        if self.slots is not None:
            slots = tuple(self.slots)
            if len(slots) != len(tensors) or any(
                later <= earlier for earlier, later in itertools.pairwise(slots)
            ):
                raise ValueError(
                    f"profile {self.name!r}: slots must give each tensor a creation index, "
                    "increasing with the tensors' order"
                )
            object.__setattr__(self, "slots", slots)

    @property
    def key(self) -> str:
        """The name as labels spell it in every report (:func:`profile_key`):
        ``resnet50-scale_0p05`` for ``resnet50[scale=0.05]``."""
        return profile_key(self.name)

    @property
    def num_tensors(self) -> int:
        """Number of tensors."""
        return len(self.tensors)

    @property
    def num_parameters(self) -> int:
        """Total number of elements over all tensors."""
        return sum(spec.num_elements for spec in self.tensors)

    @property
    def total_bytes(self) -> int:
        """Total bytes of tensor content over all tensors."""
        return sum(spec.nbytes for spec in self.tensors)

    @property
    def sizes(self) -> tuple[int, ...]:
        """Each tensor's ``nbytes``, in profile order."""
        return tuple(spec.nbytes for spec in self.tensors)

    def largest(self, k: int) -> tuple[TensorSpec, ...]:
        """The ``k`` largest tensors by bytes, largest first (ties keep profile order)."""
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        return tuple(sorted(self.tensors, key=lambda spec: -spec.nbytes)[:k])

    def concentration(self, fraction: float = 0.99) -> int:
        """The fewest tensors that together hold ``fraction`` of the parameters.

        Counted over elements, taking tensors from the largest down. Mathuriya et al. use this to
        explain why adding parameter servers beyond this count stops helping: the remaining
        tensors are too small to balance the load.
        """
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"fraction must be in (0, 1], got {fraction}")
        needed = fraction * self.num_parameters
        held = 0
        ordered = sorted((spec.num_elements for spec in self.tensors), reverse=True)
        for count, elements in enumerate(ordered, start=1):
            held += elements
            if held >= needed:
                return count
        return len(ordered)

    def scaled(
        self,
        *,
        scale: float | None = None,
        max_tensors: int | None = None,
        name_filter: str | None = None,
    ) -> Profile:
        """A smaller profile for quick runs, recording what was done in ``scaling``.

        Applied in this order: ``name_filter`` keeps the tensors of one kind when it names one
        (``conv``, ``dense``, ``norm``, ``bias``, ``embedding``, ``other``: see
        :attr:`TensorSpec.kind`, so ``"conv"`` keeps every convolution kernel whatever the
        naming style), else the tensors whose name matches it as a regular expression
        (``re.search``, e.g. ``"^res5"`` or ``"attention"``); ``max_tensors`` keeps the
        ``max_tensors`` largest by bytes (ties broken by profile order), in their original
        order; ``scale`` (in (0, 1]) shrinks every tensor to about ``scale`` times its elements
        by cutting its leading dimensions, never below one element. The name says what was
        done, e.g. ``"resnet50[scale=0.01]"``; labels spell it :attr:`key`
        (``resnet50-scale_0p01``).

        A profile is scaled once: call this on the original with all options together.
        """
        if self.scaling is not None:
            raise ValueError(
                f"profile {self.name!r} is already scaled; "
                f"scale {self.scaling.base!r} once with all options"
            )
        if scale is None and max_tensors is None and name_filter is None:
            raise ValueError("scaled() needs at least one of scale, max_tensors, name_filter")
        tensors = self.tensors
        slot_of = None
        if self.slots is not None:
            slot_of = dict(zip((t.name for t in tensors), self.slots, strict=True))
        if name_filter is not None:
            try:
                pattern = re.compile(name_filter)
            except re.error as exc:
                raise ValueError(
                    f"name_filter {name_filter!r} is not a regular expression: {exc}"
                ) from exc
            if name_filter in TENSOR_KINDS:
                tensors = tuple(spec for spec in tensors if spec.kind == name_filter)
            else:
                tensors = tuple(spec for spec in tensors if pattern.search(spec.name))
            if not tensors:
                raise ValueError(f"name_filter {name_filter!r} matches no tensor of {self.name!r}")
        if max_tensors is not None:
            if isinstance(max_tensors, bool) or not isinstance(max_tensors, int) or max_tensors < 1:
                raise ValueError(f"max_tensors must be a positive integer, got {max_tensors!r}")
            ranked = sorted(range(len(tensors)), key=lambda i: -tensors[i].nbytes)
            keep = set(ranked[:max_tensors])
            tensors = tuple(spec for i, spec in enumerate(tensors) if i in keep)
        if scale is not None:
            if not 0.0 < scale <= 1.0:
                raise ValueError(f"scale must be in (0, 1], got {scale!r}")
            tensors = tuple(
                TensorSpec(spec.name, _scaled_shape(spec.shape, scale), spec.dtype)
                for spec in tensors
            )
        scaling = Scaling(
            base=self.name,
            original_tensors=self.num_tensors,
            original_bytes=self.total_bytes,
            name_filter=name_filter,
            max_tensors=max_tensors,
            scale=scale,
        )
        return Profile(
            name=f"{self.name}[{scaling.describe()}]",
            tensors=tensors,
            source=self.source,
            scaling=scaling,
            slots=tuple(slot_of[t.name] for t in tensors) if slot_of else None,
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form that :func:`load_profile` reads back."""
        return {
            "name": self.name,
            "source": self.source,
            "tensors": [
                {"name": spec.name, "shape": list(spec.shape), "dtype": spec.dtype}
                for spec in self.tensors
            ],
        }


# --- built-in profiles ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Builtin:
    build: Callable[[], architectures.Layout]
    source: str


@dataclass(frozen=True)
class _TfCnnBuiltin:
    """A tf_cnn_benchmarks model: its trainable tensors, with their creation slots."""

    build: Callable[[], architectures.Variables]
    source: str


_TF_CNN = "tensorflow/benchmarks scripts/tf_cnn_benchmarks"
_BUILTINS: dict[str, _Builtin | _TfCnnBuiltin] = {
    "resnet50": _Builtin(architectures.resnet50, "torchvision.models.resnet50 (weights=None)"),
    "resnet101": _Builtin(architectures.resnet101, "torchvision.models.resnet101 (weights=None)"),
    "inception_v3": _Builtin(
        architectures.inception_v3,
        "torchvision.models.inception_v3 (weights=None, aux_logits=True: the training graph)",
    ),
    "vgg16": _Builtin(
        architectures.vgg16, "torchvision.models.vgg16 (weights=None); same as keras VGG16"
    ),
    "alexnet": _Builtin(architectures.alexnet, "torchvision.models.alexnet (weights=None)"),
    "googlenet": _Builtin(
        architectures.googlenet, "torchvision.models.googlenet (weights=None, aux_logits=False)"
    ),
    "hep_cnn": _Builtin(
        architectures.hep_cnn,
        "NERSC/hep_cnn_benchmark binary_classifier_tf.py, configs/cori_knl_224.json",
    ),
    "bert_base": _Builtin(
        architectures.bert_base, "transformers BertModel, bert-base-uncased config (with pooler)"
    ),
    "resnet50_tf_cnn": _TfCnnBuiltin(
        architectures.tf_cnn_resnet50,
        f"{_TF_CNN} models/resnet_model.py (resnet50, v1, 1001 classes), in variable-creation "
        "order",
    ),
    "inception3_tf_cnn": _TfCnnBuiltin(
        architectures.tf_cnn_inception3,
        f"{_TF_CNN} models/inception_model.py (inception3, 1001 classes), in variable-creation "
        "order",
    ),
}


def list_profiles() -> tuple[str, ...]:
    """Names of the built-in profiles, sorted."""
    return tuple(sorted(_BUILTINS))


def _builtin(name: str) -> Profile:
    entry = _BUILTINS[name]
    if isinstance(entry, _TfCnnBuiltin):
        variables = entry.build()
        kept = [(slot, v) for slot, v in enumerate(variables) if v[2]]
        return Profile(
            name=name,
            tensors=tuple(TensorSpec(tensor, shape) for _, (tensor, shape, _) in kept),
            source=entry.source,
            slots=tuple(slot for slot, _ in kept),
        )
    tensors = tuple(TensorSpec(tensor, shape) for tensor, shape in entry.build())
    return Profile(name=name, tensors=tensors, source=entry.source)


# --- user profiles --------------------------------------------------------------------------------


def _entry_text(entry: object) -> str:
    try:
        return json.dumps(entry)
    except (TypeError, ValueError):
        return repr(entry)


def _profile_from_entries(
    name: str, entries: Iterable[tuple[Any, Any, Any]], source: str, where: str
) -> Profile:
    """Build a profile from (tensor name, shape, dtype) entries, naming ``where`` in errors."""
    tensors: list[TensorSpec] = []
    first_at: dict[str, int] = {}
    for index, (tensor, shape, dtype) in enumerate(entries):
        shown = _entry_text({"name": tensor, "shape": shape, "dtype": dtype})
        if tensor in first_at:
            raise ValueError(
                f"{where}: tensor #{index} {shown}: duplicate name {tensor!r} "
                f"(first at #{first_at[tensor]})"
            )
        try:
            spec = TensorSpec(tensor, shape, dtype)
        except ValueError as exc:
            raise ValueError(f"{where}: tensor #{index} {shown}: {exc}") from None
        first_at[tensor] = index
        tensors.append(spec)
    if not tensors:
        raise ValueError(f"{where}: no tensors")
    return Profile(name=name, tensors=tuple(tensors), source=source)


def _json_entries(items: list[Any], where: str) -> list[tuple[str, object, str]]:
    entries: list[tuple[str, object, str]] = []
    for index, item in enumerate(items):
        if not isinstance(item, dict) or "name" not in item or "shape" not in item:
            raise ValueError(
                f"{where}: tensor #{index} {_entry_text(item)}: expected an object with "
                '"name", "shape" and optionally "dtype"'
            )
        unknown = sorted(set(item) - {"name", "shape", "dtype"})
        if unknown:
            raise ValueError(
                f"{where}: tensor #{index} {_entry_text(item)}: unknown keys {unknown}"
            )
        shape = item["shape"]
        if not isinstance(shape, list):
            raise ValueError(
                f"{where}: tensor #{index} {_entry_text(item)}: shape must be a list of integers"
            )
        entries.append((item["name"], shape, item.get("dtype", "float32")))
    return entries


def _load_json(path: Path, name: str | None) -> Profile:
    where = f"profile file '{path}'"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{where}: cannot read: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: invalid JSON: {exc}") from exc
    profile_name = path.stem
    source = str(path)
    if isinstance(data, dict):
        if "tensors" not in data or not isinstance(data["tensors"], list):
            raise ValueError(f'{where}: expected a list of tensors or an object with "tensors"')
        profile_name = str(data.get("name", profile_name))
        source = str(data.get("source") or source)
        items: list[Any] = data["tensors"]
    elif isinstance(data, list):
        items = data
    else:
        raise ValueError(f'{where}: expected a list of tensors or an object with "tensors"')
    return _profile_from_entries(name or profile_name, _json_entries(items, where), source, where)


def _dtype_name(dtype: object) -> str:
    """A framework dtype object as a numpy-style name: numpy/TensorFlow dtypes carry ``.name``,
    Keras 3 uses plain strings, PyTorch's print as ``torch.float32``."""
    if isinstance(dtype, str):
        return dtype
    name = getattr(dtype, "name", None)
    if isinstance(name, str):
        return name
    return str(dtype).removeprefix("torch.")


def _shape_of(value: object) -> object:
    shape = getattr(value, "shape", None)
    if shape is None:
        return value
    return [int(dim) for dim in shape]


def _from_mapping(source: Mapping[Any, Any], name: str | None) -> Profile:
    entries: list[tuple[str, object, str]] = []
    for key, value in source.items():
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            entries.append((key, _shape_of(value), _dtype_name(value.dtype)))
        else:
            shape = list(value) if isinstance(value, (list, tuple)) else value
            entries.append((key, shape, "float32"))
    return _profile_from_entries(name or "custom", entries, "mapping", "profile mapping")


def _is_torch_module(obj: object) -> bool:
    return callable(getattr(obj, "named_parameters", None))


def _is_keras_model(obj: object) -> bool:
    return hasattr(obj, "trainable_weights") and not isinstance(obj, Mapping)


def _from_torch(module: Any, name: str | None) -> Profile:
    cls = type(module)
    entries = [
        (param_name, _shape_of(param), _dtype_name(param.dtype))
        for param_name, param in module.named_parameters()
        if getattr(param, "requires_grad", True)
    ]
    where = f"PyTorch module {cls.__qualname__}"
    source = f"PyTorch {cls.__module__}.{cls.__qualname__} (named_parameters, requires_grad)"
    return _profile_from_entries(name or cls.__name__, entries, source, where)


def _keras_weight_name(weight: Any) -> str:
    # Keras 3 variables carry the full path in .path and only the leaf in .name; tf.keras 2
    # variables have no .path and a name like "dense/kernel:0".
    path = getattr(weight, "path", None)
    if isinstance(path, str) and path:
        return path
    return str(weight.name).removesuffix(":0")


def _from_keras(model: Any, name: str | None) -> Profile:
    cls = type(model)
    entries = [
        (_keras_weight_name(weight), _shape_of(weight), _dtype_name(weight.dtype))
        for weight in model.trainable_weights
    ]
    where = f"Keras model {getattr(model, 'name', cls.__qualname__)}"
    source = f"Keras {cls.__module__}.{cls.__qualname__} (trainable_weights)"
    model_name = getattr(model, "name", None)
    profile_name = name or (model_name if isinstance(model_name, str) else cls.__name__)
    return _profile_from_entries(profile_name, entries, source, where)


def load_profile(source: object, *, name: str | None = None) -> Profile:
    """Load a profile from any of the supported sources.

    ``source`` may be:

    * a :class:`Profile` (returned as is);
    * a built-in name, case-insensitive (see :func:`list_profiles`);
    * a path (``str`` ending in ``.json``, containing a path separator, or naming an existing
      file; or any ``os.PathLike``) to a JSON file holding
      ``{"name": ..., "tensors": [{"name": "w", "shape": [3, 3], "dtype": "float32"}, ...]}``
      or just the list of tensors (``dtype`` defaults to float32);
    * a mapping of tensor names to arrays (anything with ``.shape`` and ``.dtype``, such as numpy
      arrays) or to shapes (float32);
    * a PyTorch ``nn.Module``: its ``named_parameters()`` that require grad;
    * a Keras model: its ``trainable_weights``.

    Models are recognised by their API, so neither framework is imported here. ``name``
    overrides the profile's name. Every problem raises ``ValueError`` naming the source and,
    for files and mappings, the bad entry.
    """
    if isinstance(source, Profile):
        return source
    if isinstance(source, str):
        key = source.strip().lower()
        if key in _BUILTINS:
            profile = _builtin(key)
            if name is None:
                return profile
            return Profile(name, profile.tensors, profile.source, slots=profile.slots)
        looks_like_path = (
            source.endswith(".json") or os.sep in source or "/" in source or Path(source).is_file()
        )
        if not looks_like_path:
            raise ValueError(
                f"unknown profile {source!r}; known profiles: {', '.join(list_profiles())} "
                "(or give a path to a JSON file)"
            )
        return _load_json(Path(source), name)
    if isinstance(source, os.PathLike):
        return _load_json(Path(source), name)
    if isinstance(source, Mapping):
        return _from_mapping(source, name)
    # Keras first: a Keras 3 model on the torch backend is also an nn.Module, and its Keras
    # variable paths are the better names.
    if _is_keras_model(source):
        return _from_keras(source, name)
    if _is_torch_module(source):
        return _from_torch(source, name)
    raise ValueError(
        f"cannot make a profile from {type(source).__name__}: expected a profile name, a JSON "
        "path, a mapping of names to arrays or shapes, a PyTorch module or a Keras model"
    )
