"""Model profiles: built-in layouts pinned to their references, scaling, and user profiles.

The PyTorch and Keras paths are exercised with small fakes that mimic the APIs the loader uses;
the real libraries are not installed in the test environment.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import FrozenInstanceError
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_tfgrpc.model import architectures
from pytest_tfgrpc.model.profiles import (
    Profile,
    Scaling,
    TensorSpec,
    list_profiles,
    load_profile,
    profile_key,
)

# name, trainable tensors, trainable parameters, the reference those numbers come from.
REFERENCE_TOTALS = [
    ("resnet50", 161, 25_557_032, "torchvision.models.resnet50(weights=None)"),
    ("resnet101", 314, 44_549_160, "torchvision.models.resnet101(weights=None)"),
    ("inception_v3", 292, 27_161_264, "torchvision.models.inception_v3(weights=None), aux_logits"),
    ("vgg16", 32, 138_357_544, "torchvision.models.vgg16(weights=None) == keras VGG16"),
    ("alexnet", 16, 61_100_840, "torchvision.models.alexnet(weights=None)"),
    ("googlenet", 173, 6_624_904, "torchvision.models.googlenet(weights=None, aux_logits=False)"),
    ("hep_cnn", 12, 594_178, "NERSC/hep_cnn_benchmark build_cnn_model, cori_knl_224.json"),
    ("bert_base", 199, 109_482_240, "transformers BertModel(bert-base-uncased), with pooler"),
    # tf_cnn_benchmarks' heads have 1001 classes: 2048 * 1 + 1 = 2,049 more than the
    # 1000-class references checked in test_tf_cnn_profiles_match_published_counts.
    ("resnet50_tf_cnn", 161, 25_559_081, "torchvision resnet50 + 2,049 for class 1001"),
    ("inception3_tf_cnn", 190, 23_819_401, "keras InceptionV3 trainable + 2,049"),
]


@pytest.mark.parametrize(
    ("name", "tensors", "parameters", "reference"),
    REFERENCE_TOTALS,
    ids=[row[0] for row in REFERENCE_TOTALS],
)
def test_builtin_profile_matches_reference(
    name: str, tensors: int, parameters: int, reference: str
) -> None:
    profile = load_profile(name)
    assert profile.name == name
    assert profile.num_tensors == tensors, reference
    assert profile.num_parameters == parameters, reference
    assert profile.total_bytes == 4 * parameters  # all float32
    assert all(spec.dtype == "float32" for spec in profile.tensors)
    assert profile.source


def test_every_builtin_is_pinned() -> None:
    assert set(list_profiles()) == {row[0] for row in REFERENCE_TOTALS}
    assert list_profiles() == tuple(sorted(list_profiles()))


def test_tf_cnn_profiles_match_published_counts() -> None:
    # With 1000 classes, tf_cnn_benchmarks' ResNet-50 has torchvision's 25,557,032 trainable
    # parameters and Keras ResNet50's 53,120 moving statistics; its Inception-v3 has Keras
    # InceptionV3's 23,817,352 trainable and 34,432 non-trainable parameters (model.summary()).
    for build, trainable, frozen in (
        (architectures.tf_cnn_resnet50, 25_557_032, 53_120),
        (architectures.tf_cnn_inception3, 23_817_352, 34_432),
    ):
        variables = build(1000)
        assert variables[0] == ("global_step", (), False)
        assert sum(int(np.prod(s)) for _, s, t in variables if t) == trainable
        assert sum(int(np.prod(s)) for _, s, t in variables[1:] if not t) == frozen


def test_tf_cnn_slots_follow_variable_creation_order() -> None:
    resnet = load_profile("resnet50_tf_cnn")
    # global_step is slot 0; conv0's kernel, gamma, beta take 1-3, its moving stats 4-5.
    assert resnet.slots is not None and resnet.slots[:4] == (1, 2, 3, 6)
    assert resnet.tensors[0].shape == (7, 7, 3, 64)
    # the first block's projection shortcut is created before its residual branch
    assert resnet.tensors[3].shape == (1, 1, 64, 256)
    inception = load_profile("inception3_tf_cnn")
    # scale=False: kernel, beta, then two moving statistics: four slots per convolution
    assert inception.slots is not None and inception.slots[:4] == (1, 2, 5, 6)
    scaled = inception.scaled(max_tensors=3)
    assert scaled.slots is not None and len(scaled.slots) == 3
    with pytest.raises(ValueError, match="slots"):
        Profile("x", (TensorSpec("a", (1,)), TensorSpec("b", (1,))), slots=(2, 1))


def test_googlenet_with_auxiliary_heads_matches_torchvision_default() -> None:
    # torchvision.models.googlenet(weights=None) keeps aux_logits=True: 13,004,888 parameters.
    layout = architectures.googlenet(aux_logits=True)
    assert len(layout) == 187
    assert sum(int(np.prod(shape)) for _, shape in layout) == 13_004_888


def test_resnet50_layout_follows_torchvision() -> None:
    tensors = {spec.name: spec.shape for spec in load_profile("resnet50").tensors}
    assert tensors["conv1/kernel"] == (7, 7, 3, 64)
    assert tensors["res2a_branch2a/bn/gamma"] == (64,)
    assert tensors["res2a_branch1/kernel"] == (1, 1, 64, 256)  # projection shortcut
    assert "res2b_branch1/kernel" not in tensors
    assert tensors["res5c_branch2c/kernel"] == (1, 1, 512, 2048)
    assert tensors["fc1000/kernel"] == (2048, 1000)
    # torchvision's convolutions have no bias: BatchNorm's beta plays that part.
    conv_biases = [n for n in tensors if n.endswith("/bias") and not n.startswith("fc")]
    assert conv_biases == []
    names = list(tensors)
    assert names[:3] == ["conv1/kernel", "conv1/bn/gamma", "conv1/bn/beta"]
    assert names[-2:] == ["fc1000/kernel", "fc1000/bias"]


def test_resnet101_names_long_stage_like_the_original_release() -> None:
    names = {spec.name for spec in load_profile("resnet101").tensors}
    assert "res4b22_branch2c/kernel" in names
    assert "res4b23_branch2c/kernel" not in names
    assert "res3d_branch2c/kernel" in names


def test_batchnorm_gamma_always_has_beta() -> None:
    for name in list_profiles():
        names = {spec.name for spec in load_profile(name).tensors}
        gammas = {n.removesuffix("/gamma") for n in names if n.endswith("/gamma")}
        betas = {n.removesuffix("/beta") for n in names if n.endswith("/beta")}
        # tf_cnn_benchmarks' Inception-v3 normalises with scale=False: beta without gamma
        assert gammas <= betas, name
        if not name.endswith("_tf_cnn"):
            assert gammas == betas, name


def test_hep_cnn_is_small_and_binary() -> None:
    profile = load_profile("hep_cnn")
    assert profile.num_parameters < 1_000_000
    shapes = {spec.name: spec.shape for spec in profile.tensors}
    assert shapes["conv1_w"] == (3, 3, 3, 128)
    assert shapes["conv5_w"] == (3, 3, 128, 128)
    assert shapes["fc1_w"] == (128, 2)


def test_bert_base_layers() -> None:
    shapes = {spec.name: spec.shape for spec in load_profile("bert_base").tensors}
    assert shapes["bert/embeddings/word_embeddings"] == (30522, 768)
    assert shapes["bert/encoder/layer_11/intermediate/dense/kernel"] == (768, 3072)
    assert "bert/encoder/layer_12/output/dense/kernel" not in shapes
    assert shapes["bert/pooler/dense/kernel"] == (768, 768)


def test_load_profile_is_case_insensitive() -> None:
    assert load_profile("ResNet50") == load_profile("resnet50")
    assert load_profile(" VGG16 ").name == "vgg16"


def test_unknown_profile_name_lists_known_names() -> None:
    with pytest.raises(ValueError, match="unknown profile 'resnet51'") as info:
        load_profile("resnet51")
    for known in list_profiles():
        assert known in str(info.value)


# --- TensorSpec ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "itemsize"),
    [("float32", 4), ("float16", 2), ("bfloat16", 2), ("float64", 8), ("int8", 1), ("bool", 1)],
)
def test_nbytes_is_elements_times_itemsize(dtype: str, itemsize: int) -> None:
    spec = TensorSpec("w", (3, 5, 7), dtype)
    assert spec.num_elements == 105
    assert spec.nbytes == 105 * itemsize


def test_every_builtin_tensor_nbytes_matches_numpy() -> None:
    for spec in load_profile("googlenet").tensors:
        assert spec.nbytes == np.zeros(spec.shape, dtype=spec.dtype).nbytes


def test_tensor_spec_normalises_and_is_frozen() -> None:
    spec = TensorSpec("w", [np.int64(2), 3], "f4")  # type: ignore[arg-type]
    assert spec.shape == (2, 3)
    assert type(spec.shape[0]) is int
    assert spec.dtype == "float32"
    assert TensorSpec("scalar", ()).num_elements == 1
    assert TensorSpec("empty", (0, 4)).nbytes == 0
    with pytest.raises(FrozenInstanceError):
        spec.name = "v"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("shape", "dtype", "message"),
    [
        ((3, -1), "float32", "negative dimension -1"),
        ((3, 1.5), "float32", "dimension 1.5 is not an integer"),
        ((True,), "float32", "dimension True is not an integer"),
        ("33", "float32", "shape must be a sequence"),
        ((3,), "float33", "unknown dtype 'float33'"),
        ((3,), "U8", "unknown dtype 'U8'"),
    ],
)
def test_tensor_spec_rejects(shape: Any, dtype: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TensorSpec("w", shape, dtype)


# --- Profile queries ------------------------------------------------------------------------------


def _toy() -> Profile:
    return Profile(
        "toy",
        (
            TensorSpec("a", (10,)),
            TensorSpec("b", (1000,)),
            TensorSpec("c", (100,), "float64"),
            TensorSpec("d", (500,), "float16"),
        ),
        source="test",
    )


def test_sizes_largest_and_totals() -> None:
    toy = _toy()
    assert toy.sizes == (40, 4000, 800, 1000)
    assert toy.total_bytes == 5840
    assert toy.num_parameters == 1610
    assert [spec.name for spec in toy.largest(2)] == ["b", "d"]
    assert toy.largest(0) == ()
    assert len(toy.largest(10)) == 4


def test_profile_rejects_duplicates_and_emptiness() -> None:
    with pytest.raises(ValueError, match=r"duplicate tensor name 'w' \(tensors #0 and #1\)"):
        Profile("p", (TensorSpec("w", (1,)), TensorSpec("w", (2,))))
    with pytest.raises(ValueError, match="has no tensors"):
        Profile("p", ())


def test_concentration_counts_largest_tensors_first() -> None:
    toy = _toy()  # elements 1000, 500, 100, 10 of 1610
    assert toy.concentration(0.6) == 1
    assert toy.concentration(0.9) == 2
    assert toy.concentration(0.99) == 3
    assert toy.concentration(1.0) == 4
    with pytest.raises(ValueError, match="fraction"):
        toy.concentration(0.0)


def test_resnet50_concentration() -> None:
    # Mathuriya et al. (2017) say ~54 large tensors hold 99% of ResNet-50's parameters; the
    # torchvision layout gives 44 (of 161), and 26 hold 90%.
    profile = load_profile("resnet50")
    assert profile.concentration(0.99) == 44
    assert profile.concentration(0.90) == 26
    elements = sorted((spec.num_elements for spec in profile.tensors), reverse=True)
    assert sum(elements[:43]) < 0.99 * profile.num_parameters <= sum(elements[:44])


# --- scaling --------------------------------------------------------------------------------------


def test_scale_shrinks_every_tensor_and_records_it() -> None:
    full = load_profile("resnet50")
    small = full.scaled(scale=0.01)
    assert small.name == "resnet50[scale=0.01]"
    assert small.scaling == Scaling(
        base="resnet50",
        original_tensors=161,
        original_bytes=full.total_bytes,
        scale=0.01,
    )
    assert [s.name for s in small.tensors] == [s.name for s in full.tensors]
    for before, after in zip(full.tensors, small.tensors, strict=True):
        assert 1 <= after.num_elements <= before.num_elements
        assert len(after.shape) == len(before.shape)
    shapes = {spec.name: spec.shape for spec in small.tensors}
    # Leading dimensions go first; trailing ones stay whole while they fit the target.
    assert shapes["fc1000/kernel"] == (20, 1000)  # 2048x1000 -> 20480 elements
    assert shapes["res5a_branch2b/kernel"] == (1, 1, 46, 512)  # 3x3x512x512 -> 23593
    assert shapes["conv1/kernel"] == (1, 1, 1, 64)  # 7x7x3x64 -> 94: one step of 64 elements
    assert shapes["conv1/bn/gamma"] == (1,)  # never below one element
    assert abs(small.total_bytes - 0.01 * full.total_bytes) < 0.002 * full.total_bytes


def test_max_tensors_keeps_the_largest_in_profile_order() -> None:
    toy = _toy()
    kept = toy.scaled(max_tensors=2)
    assert [spec.name for spec in kept.tensors] == ["b", "d"]
    assert kept.name == "toy[max_tensors=2]"
    assert kept.scaling is not None and kept.scaling.max_tensors == 2
    assert kept.scaling.original_bytes == 5840
    resnet = load_profile("resnet50").scaled(max_tensors=44)
    assert resnet.num_tensors == 44
    assert resnet.num_parameters >= 0.99 * 25_557_032


def test_filter_then_max_tensors_then_scale() -> None:
    bert = load_profile("bert_base")
    quick = bert.scaled(name_filter=r"layer_0/", max_tensors=3, scale=0.5)
    assert quick.name == "bert_base[filter=layer_0/,max_tensors=3,scale=0.5]"
    names = [spec.name for spec in quick.tensors]
    assert names == [
        "bert/encoder/layer_0/attention/self/query/kernel",
        "bert/encoder/layer_0/intermediate/dense/kernel",
        "bert/encoder/layer_0/output/dense/kernel",
    ]
    assert [spec.shape for spec in quick.tensors] == [(384, 768), (384, 3072), (1536, 768)]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "at least one of"),
        ({"scale": 0.0}, r"scale must be in \(0, 1\]"),
        ({"scale": 2.0}, r"scale must be in \(0, 1\]"),
        ({"max_tensors": 0}, "max_tensors must be a positive integer"),
        ({"name_filter": "nomatch"}, "matches no tensor of 'toy'"),
        ({"name_filter": "("}, "is not a regular expression"),
    ],
)
def test_scaled_rejects(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _toy().scaled(**kwargs)


def test_scaled_profile_is_not_scaled_twice() -> None:
    with pytest.raises(ValueError, match="already scaled; scale 'toy' once"):
        _toy().scaled(scale=0.5).scaled(max_tensors=1)


# --- JSON files -----------------------------------------------------------------------------------


def _write(tmp_path: Path, data: object, name: str = "model.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_json_object_file(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        {
            "name": "mine",
            "tensors": [
                {"name": "dense/kernel", "shape": [784, 10]},
                {"name": "dense/bias", "shape": [10], "dtype": "float16"},
            ],
        },
    )
    profile = load_profile(str(path))
    assert profile.name == "mine"
    assert profile.source == str(path)
    assert profile.tensors == (
        TensorSpec("dense/kernel", (784, 10), "float32"),
        TensorSpec("dense/bias", (10,), "float16"),
    )
    assert profile.total_bytes == 784 * 10 * 4 + 10 * 2
    assert load_profile(path) == profile  # a Path works too


def test_json_list_file_takes_its_name_from_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, [{"name": "w", "shape": [3, 3]}], name="tiny_net.json")
    profile = load_profile(path)
    assert profile.name == "tiny_net"
    assert load_profile(path, name="renamed").name == "renamed"


def test_profile_round_trips_through_json(tmp_path: Path) -> None:
    original = load_profile("alexnet")
    path = _write(tmp_path, original.to_dict())
    assert load_profile(path) == original


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        (
            [{"name": "w", "shape": [3]}, {"name": "w", "shape": [4]}],
            r'tensor #1 \{"name": "w", "shape": \[4\], "dtype": "float32"\}: '
            r"duplicate name 'w' \(first at #0\)",
        ),
        (
            [{"name": "w", "shape": [3, -2]}],
            r'tensor #0 \{"name": "w", "shape": \[3, -2\], "dtype": "float32"\}: '
            "shape .* negative dimension -2",
        ),
        (
            [{"name": "w", "shape": [3], "dtype": "float33"}],
            r"tensor #0 .*\"float33\".*: unknown dtype 'float33'",
        ),
        ([{"name": "w"}], r'tensor #0 \{"name": "w"\}: expected an object with "name", "shape"'),
        ([{"name": "w", "shape": 3}], "tensor #0 .*: shape must be a list of integers"),
        ([{"name": "w", "shape": [3], "size": 3}], r"unknown keys \['size'\]"),
        ([], "no tensors"),
    ],
)
def test_json_errors_quote_file_and_entry(tmp_path: Path, tensors: list[Any], message: str) -> None:
    path = _write(tmp_path, {"name": "bad", "tensors": tensors})
    with pytest.raises(ValueError, match=message) as info:
        load_profile(str(path))
    assert str(info.value).startswith(f"profile file '{path}': ")


def test_json_file_problems(tmp_path: Path) -> None:
    missing = tmp_path / "absent.json"
    with pytest.raises(ValueError, match=re.escape(f"profile file '{missing}': cannot read")):
        load_profile(str(missing))
    broken = tmp_path / "broken.json"
    broken.write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match=r"broken\.json': invalid JSON"):
        load_profile(broken)
    with pytest.raises(ValueError, match='expected a list of tensors or an object with "tensors"'):
        load_profile(_write(tmp_path, {"name": "x"}))


# --- mappings -------------------------------------------------------------------------------------


def test_mapping_of_arrays_and_shapes() -> None:
    profile = load_profile(
        {
            "embedding": np.zeros((100, 16), dtype=np.float16),
            "head/kernel": (16, 4),
            "head/bias": [4],
            "step": np.int64(0),
        },
        name="mapped",
    )
    assert profile.name == "mapped"
    assert profile.source == "mapping"
    assert [(s.name, s.shape, s.dtype) for s in profile.tensors] == [
        ("embedding", (100, 16), "float16"),
        ("head/kernel", (16, 4), "float32"),
        ("head/bias", (4,), "float32"),
        ("step", (), "int64"),
    ]
    assert profile.total_bytes == 100 * 16 * 2 + 64 * 4 + 4 * 4 + 8


def test_mapping_errors_name_the_entry() -> None:
    with pytest.raises(ValueError, match=r"profile mapping: tensor #1 .*negative dimension -4"):
        load_profile({"ok": [2], "bad": [-4]})
    with pytest.raises(ValueError, match=r"profile mapping: tensor #0 .*shape must be a sequence"):
        load_profile({"count": 7})


def test_unsupported_source_type() -> None:
    with pytest.raises(ValueError, match="cannot make a profile from int"):
        load_profile(42)


# --- framework models (fakes: torch and tensorflow/keras are not installed here) ------------------


class _FakeDType:
    """Prints like ``torch.float32``; has no ``.name``, like torch.dtype."""

    def __init__(self, text: str) -> None:
        self._text = text

    def __str__(self) -> str:
        return self._text


class _FakeParameter:
    def __init__(self, shape: tuple[int, ...], dtype: str, requires_grad: bool = True) -> None:
        self.shape = shape  # torch.Size is a tuple subclass
        self.dtype = _FakeDType(dtype)
        self.requires_grad = requires_grad


class TinyTorchNet:
    """Mimics the part of ``torch.nn.Module`` the loader uses."""

    def named_parameters(self) -> Iterator[tuple[str, _FakeParameter]]:
        yield "conv.weight", _FakeParameter((8, 3, 3, 3), "torch.float32")
        yield "bn.weight", _FakeParameter((8,), "torch.float32")
        yield "bn.bias", _FakeParameter((8,), "torch.float32")
        yield "frozen.weight", _FakeParameter((1000, 8), "torch.float32", requires_grad=False)
        yield "head.weight", _FakeParameter((2, 8), "torch.bfloat16")


def test_torch_module_trainable_parameters() -> None:
    profile = load_profile(TinyTorchNet())
    assert profile.name == "TinyTorchNet"
    assert "named_parameters" in profile.source
    assert [(s.name, s.shape, s.dtype) for s in profile.tensors] == [
        ("conv.weight", (8, 3, 3, 3), "float32"),
        ("bn.weight", (8,), "float32"),
        ("bn.bias", (8,), "float32"),
        ("head.weight", (2, 8), "bfloat16"),
    ]
    assert profile.total_bytes == (216 + 16) * 4 + 16 * 2


class _FakeKerasDType:
    name = "float32"  # tf.DType carries its numpy-style name


class _FakeVariable:
    def __init__(self, path: str | None, name: str, shape: tuple[int, ...], dtype: Any) -> None:
        if path is not None:
            self.path = path
        self.name = name
        self.shape = shape
        self.dtype = dtype


class _FakeKerasModel:
    def __init__(self, weights: list[_FakeVariable]) -> None:
        self.name = "tiny_keras"
        self.trainable_weights = weights
        self.non_trainable_weights = [_FakeVariable("bn/moving_mean", "moving_mean", (8,), "x")]


def test_keras3_model_uses_variable_paths() -> None:
    model = _FakeKerasModel(
        [
            _FakeVariable("dense/kernel", "kernel", (4, 8), "float32"),
            _FakeVariable("dense/bias", "bias", (8,), "float32"),
            _FakeVariable("bn/gamma", "gamma", (8,), "float16"),
        ]
    )
    profile = load_profile(model)
    assert profile.name == "tiny_keras"
    assert "trainable_weights" in profile.source
    assert [(s.name, s.shape, s.dtype) for s in profile.tensors] == [
        ("dense/kernel", (4, 8), "float32"),
        ("dense/bias", (8,), "float32"),
        ("bn/gamma", (8,), "float16"),
    ]


def test_tf_keras2_model_uses_names_without_device_suffix() -> None:
    model = _FakeKerasModel(
        [
            _FakeVariable(None, "dense/kernel:0", (4, 8), _FakeKerasDType()),
            _FakeVariable(None, "dense/bias:0", (8,), _FakeKerasDType()),
        ]
    )
    profile = load_profile(model, name="tf2")
    assert profile.name == "tf2"
    assert [s.name for s in profile.tensors] == ["dense/kernel", "dense/bias"]
    assert profile.total_bytes == 40 * 4


def test_keras_duplicate_names_are_reported() -> None:
    model = _FakeKerasModel(
        [
            _FakeVariable(None, "kernel:0", (2,), "float32"),
            _FakeVariable(None, "kernel:0", (3,), "float32"),
        ]
    )
    with pytest.raises(ValueError, match=r"Keras model tiny_keras: tensor #1 .*duplicate name"):
        load_profile(model)


class _KerasOnTorchModel(_FakeKerasModel):
    """Keras 3 on the torch backend: the model is also an ``nn.Module``."""

    def named_parameters(self) -> Iterator[tuple[str, _FakeParameter]]:
        yield "_tracked.0", _FakeParameter((4, 8), "torch.float32")


def test_keras_model_on_torch_backend_keeps_keras_names() -> None:
    model = _KerasOnTorchModel([_FakeVariable("dense/kernel", "kernel", (4, 8), "float32")])
    assert [s.name for s in load_profile(model).tensors] == ["dense/kernel"]


def test_name_filter_conv_keeps_every_convolution_kernel_of_resnet50() -> None:
    base = load_profile("resnet50")
    conv = base.scaled(name_filter="conv")
    kernels = [t for t in base.tensors if len(t.shape) == 4]
    assert conv.num_tensors == len(kernels) == 53
    assert conv.total_bytes == sum(t.nbytes for t in kernels)
    assert conv.total_bytes > 0.9 * base.total_bytes  # the bulk of ResNet-50's weights
    assert conv.name == "resnet50[filter=conv]"


@pytest.mark.parametrize(
    ("shapes", "kind", "kept"),
    [
        # Keras-style names
        (
            {"conv2d/kernel:0": (3, 3, 3, 8), "conv2d/bias:0": (8,), "dense/kernel:0": (8, 2)},
            "conv",
            ["conv2d/kernel:0"],
        ),
        # PyTorch-style names: a 1-D weight is a normalization's scale
        (
            {
                "layer1.0.conv1.weight": (8, 3, 3, 3),
                "layer1.0.bn1.weight": (8,),
                "fc.weight": (2, 8),
            },
            "norm",
            ["layer1.0.bn1.weight"],
        ),
        ({"fc1_w": (8, 2), "fc1_b": (2,), "conv1_w": (3, 3, 1, 8)}, "dense", ["fc1_w"]),
        (
            {"emb/word_embeddings": (100, 8), "emb/LayerNorm/gamma": (8,)},
            "embedding",
            ["emb/word_embeddings"],
        ),
    ],
)
def test_name_filter_kinds_hold_whatever_the_naming_style(
    shapes: dict[str, tuple[int, ...]], kind: str, kept: list[str]
) -> None:
    profile = load_profile(shapes).scaled(name_filter=kind)
    assert [t.name for t in profile.tensors] == kept


def test_a_name_filter_that_is_no_kind_is_a_regular_expression_on_names() -> None:
    res5 = load_profile("resnet50").scaled(name_filter="^res5")
    assert res5.num_tensors > 0
    assert all(t.name.startswith("res5") for t in res5.tensors)


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("resnet50", "resnet50"),
        ("resnet50[scale=0.05]", "resnet50-scale_0p05"),
        (
            "resnet50[filter=conv,max_tensors=10,scale=0.05]",
            "resnet50-filter_conv-max_tensors_10-scale_0p05",
        ),
        (
            "bert_base[filter=layer_0/,max_tensors=3,scale=0.5]",
            "bert_base-filter_layer_0-max_tensors_3-scale_0p5",
        ),
        ("my model.json", "my_modelpjson"),
    ],
)
def test_profile_keys_are_safe_for_ci_parsers(name: str, key: str) -> None:
    assert profile_key(name) == key
    assert re.fullmatch(r"[A-Za-z0-9_-]+", profile_key(name))


def test_a_scaled_profile_is_labelled_by_its_key() -> None:
    assert load_profile("resnet50").scaled(scale=0.05).key == "resnet50-scale_0p05"
