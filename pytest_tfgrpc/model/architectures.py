"""Layer-by-layer builders for the built-in model profiles.

Each builder walks a published architecture (stages, blocks, branches) and returns its trainable
tensors as ``(name, shape)`` pairs in the order the reference implementation registers them, which
is the order their gradients are produced in reverse during the backward pass.

Conventions shared by every builder:

* Shapes use TensorFlow's layouts: a convolution kernel is ``(kh, kw, in, out)``, a dense kernel
  ``(in, out)``, an embedding table ``(vocab, width)``. Only the element count matters for traffic.
* Only trainable tensors are listed. BatchNorm's ``gamma`` and ``beta`` are trainable (they are
  ``weight`` and ``bias`` parameters in PyTorch); its moving mean and variance are buffers, not
  parameters, and are left out. This is how torchvision counts parameters.
* Names are TensorFlow-style variable paths (``scope/.../kernel``), built from the reference
  implementation's module names.

This module has no dependency on the rest of the package; ``profiles`` turns these layouts into
``Profile`` objects.
"""

from __future__ import annotations

from collections.abc import Sequence

Shape = tuple[int, ...]
Layout = tuple[tuple[str, Shape], ...]


class _Layers:
    """Accumulates the trainable tensors of a network as its layers are declared."""

    def __init__(self) -> None:
        self._tensors: list[tuple[str, Shape]] = []

    def add(self, name: str, *shape: int) -> None:
        self._tensors.append((name, tuple(shape)))

    def conv(
        self, name: str, cin: int, cout: int, kernel: int | tuple[int, int], *, bias: bool
    ) -> None:
        kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
        self.add(f"{name}/kernel", kh, kw, cin, cout)
        if bias:
            self.add(f"{name}/bias", cout)

    def norm(self, name: str, channels: int) -> None:
        """The trainable scale (gamma) and offset (beta) of a BatchNorm or LayerNorm."""
        self.add(f"{name}/gamma", channels)
        self.add(f"{name}/beta", channels)

    def conv_bn(self, name: str, cin: int, cout: int, kernel: int | tuple[int, int]) -> None:
        """A bias-free convolution followed by BatchNorm (its bias is BatchNorm's beta)."""
        self.conv(name, cin, cout, kernel, bias=False)
        self.norm(f"{name}/bn", cout)

    def dense(self, name: str, din: int, dout: int) -> None:
        self.add(f"{name}/kernel", din, dout)
        self.add(f"{name}/bias", dout)

    def layout(self) -> Layout:
        return tuple(self._tensors)


# --- ResNet (He et al. 2015), as torchvision.models.resnet builds it -----------------------------


def _block_suffixes(count: int) -> list[str]:
    # The Caffe/Keras naming of the original release: res4a, res4b, ... and, for stages too long
    # for letters (ResNet-101's 23 blocks), res4a, res4b1, res4b2, ...
    if count <= 6:
        return [chr(ord("a") + i) for i in range(count)]
    return ["a"] + [f"b{i}" for i in range(1, count)]


def resnet_bottleneck(blocks_per_stage: Sequence[int], num_classes: int = 1000) -> Layout:
    """ResNet with bottleneck blocks (ResNet-50/101/152) as in ``torchvision.models.resnet``.

    Stem: 7x7/2 convolution to 64 channels with BatchNorm. Stage ``s`` (widths 64, 128, 256, 512)
    holds ``blocks_per_stage[s]`` blocks of 1x1 -> 3x3 -> 1x1 convolutions expanding to four times
    the width; the first block of each stage has a 1x1 projection shortcut. Convolutions carry no
    bias (BatchNorm follows each). Head: a dense layer from 2048 features to the classes.
    """
    layers = _Layers()
    layers.conv_bn("conv1", 3, 64, 7)
    inplanes = 64
    expansion = 4
    if len(blocks_per_stage) != 4:
        raise ValueError(f"a ResNet has 4 stages, got {len(blocks_per_stage)}")
    widths = (64, 128, 256, 512)
    for stage, (width, count) in enumerate(zip(widths, blocks_per_stage, strict=True), start=2):
        for suffix in _block_suffixes(count):
            prefix = f"res{stage}{suffix}"
            layers.conv_bn(f"{prefix}_branch2a", inplanes, width, 1)
            layers.conv_bn(f"{prefix}_branch2b", width, width, 3)
            layers.conv_bn(f"{prefix}_branch2c", width, width * expansion, 1)
            if suffix == "a":
                # torchvision registers the projection shortcut after the three convolutions.
                layers.conv_bn(f"{prefix}_branch1", inplanes, width * expansion, 1)
            inplanes = width * expansion
    layers.dense(f"fc{num_classes}", 512 * expansion, num_classes)
    return layers.layout()


def resnet50() -> Layout:
    """ResNet-50: bottleneck stages of 3, 4, 6 and 3 blocks."""
    return resnet_bottleneck((3, 4, 6, 3))


def resnet101() -> Layout:
    """ResNet-101: bottleneck stages of 3, 4, 23 and 3 blocks."""
    return resnet_bottleneck((3, 4, 23, 3))


# --- VGG (Simonyan & Zisserman 2014) and AlexNet (Krizhevsky et al. 2012) ------------------------

_VGG16_STAGES: tuple[tuple[int, int], ...] = ((2, 64), (2, 128), (3, 256), (3, 512), (3, 512))


def vgg(stages: Sequence[tuple[int, int]] = _VGG16_STAGES, num_classes: int = 1000) -> Layout:
    """VGG as in ``torchvision.models.vgg`` (configuration "D" for VGG-16) and Keras ``VGG16``.

    ``stages`` lists (convolutions, channels) per block; every convolution is 3x3 with a bias, and
    each block ends in a 2x2 max pool, so a 224x224 input leaves a 7x7 map. Head: dense layers
    7*7*512 -> 4096 -> 4096 -> classes. Names follow Keras (``block1_conv1``, ``fc1``).
    """
    layers = _Layers()
    cin = 3
    for block, (count, channels) in enumerate(stages, start=1):
        for conv in range(1, count + 1):
            layers.conv(f"block{block}_conv{conv}", cin, channels, 3, bias=True)
            cin = channels
    layers.dense("fc1", 7 * 7 * cin, 4096)
    layers.dense("fc2", 4096, 4096)
    layers.dense("predictions", 4096, num_classes)
    return layers.layout()


def vgg16() -> Layout:
    """VGG-16: 13 convolutions in five blocks, then three dense layers."""
    return vgg(_VGG16_STAGES)


def alexnet(num_classes: int = 1000) -> Layout:
    """AlexNet as in ``torchvision.models.alexnet`` (the one-GPU variant of Krizhevsky's "One weird
    trick" paper): convolutions 11x11 -> 64, 5x5 -> 192, 3x3 -> 384, 256, 256, all with biases; a
    6x6 adaptive average pool; dense layers 6*6*256 -> 4096 -> 4096 -> classes.
    """
    layers = _Layers()
    cin = 3
    for index, (kernel, cout) in enumerate(((11, 64), (5, 192), (3, 384), (3, 256), (3, 256)), 1):
        layers.conv(f"conv{index}", cin, cout, kernel, bias=True)
        cin = cout
    layers.dense("fc6", 6 * 6 * cin, 4096)
    layers.dense("fc7", 4096, 4096)
    layers.dense("fc8", 4096, num_classes)
    return layers.layout()


# --- GoogLeNet (Szegedy et al. 2014), as torchvision.models.googlenet builds it ------------------

# (name, 1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool projection): Table 1 of the paper.
_GOOGLENET_INCEPTIONS: tuple[tuple[str, int, int, int, int, int, int], ...] = (
    ("inception3a", 64, 96, 128, 16, 32, 32),
    ("inception3b", 128, 128, 192, 32, 96, 64),
    ("inception4a", 192, 96, 208, 16, 48, 64),
    ("inception4b", 160, 112, 224, 24, 64, 64),
    ("inception4c", 128, 128, 256, 24, 64, 64),
    ("inception4d", 112, 144, 288, 32, 64, 64),
    ("inception4e", 256, 160, 320, 32, 128, 128),
    ("inception5a", 256, 160, 320, 32, 128, 128),
    ("inception5b", 384, 192, 384, 48, 128, 128),
)


def googlenet(num_classes: int = 1000, *, aux_logits: bool = False) -> Layout:
    """GoogLeNet as in ``torchvision.models.googlenet``: every convolution is bias-free with
    BatchNorm (torchvision's BN-GoogLeNet), the nine inception modules of the paper's Table 1, and
    a dense layer 1024 -> classes. torchvision's "5x5" branch uses a 3x3 kernel (a known quirk it
    keeps for compatibility with its weights); this layout does the same, or the totals would
    differ. With ``aux_logits`` the two auxiliary heads (after inception4a and inception4d) are
    included, registered where torchvision registers them: after inception4e.
    """
    layers = _Layers()
    layers.conv_bn("conv1", 3, 64, 7)
    layers.conv_bn("conv2", 64, 64, 1)
    layers.conv_bn("conv3", 64, 192, 3)
    cin = 192
    channels_after: dict[str, int] = {}
    for name, c1, c3r, c3, c5r, c5, pool in _GOOGLENET_INCEPTIONS:
        layers.conv_bn(f"{name}/branch1", cin, c1, 1)
        layers.conv_bn(f"{name}/branch2_1", cin, c3r, 1)
        layers.conv_bn(f"{name}/branch2_2", c3r, c3, 3)
        layers.conv_bn(f"{name}/branch3_1", cin, c5r, 1)
        layers.conv_bn(f"{name}/branch3_2", c5r, c5, 3)
        layers.conv_bn(f"{name}/branch4", cin, pool, 1)
        cin = c1 + c3 + c5 + pool
        channels_after[name] = cin
        if aux_logits and name == "inception4e":
            for aux, source in (("aux1", "inception4a"), ("aux2", "inception4d")):
                layers.conv_bn(f"{aux}/conv", channels_after[source], 128, 1)
                # A 4x4 adaptive pool leaves 4*4*128 = 2048 features.
                layers.dense(f"{aux}/fc1", 4 * 4 * 128, 1024)
                layers.dense(f"{aux}/fc2", 1024, num_classes)
    layers.dense("fc", cin, num_classes)
    return layers.layout()


# --- Inception-v3 (Szegedy et al. 2015), as torchvision.models.inception_v3 builds it ------------


def _inception_a(layers: _Layers, name: str, cin: int, pool_features: int) -> int:
    layers.conv_bn(f"{name}/branch1x1", cin, 64, 1)
    layers.conv_bn(f"{name}/branch5x5_1", cin, 48, 1)
    layers.conv_bn(f"{name}/branch5x5_2", 48, 64, 5)
    layers.conv_bn(f"{name}/branch3x3dbl_1", cin, 64, 1)
    layers.conv_bn(f"{name}/branch3x3dbl_2", 64, 96, 3)
    layers.conv_bn(f"{name}/branch3x3dbl_3", 96, 96, 3)
    layers.conv_bn(f"{name}/branch_pool", cin, pool_features, 1)
    return 64 + 64 + 96 + pool_features


def _inception_b(layers: _Layers, name: str, cin: int) -> int:
    layers.conv_bn(f"{name}/branch3x3", cin, 384, 3)
    layers.conv_bn(f"{name}/branch3x3dbl_1", cin, 64, 1)
    layers.conv_bn(f"{name}/branch3x3dbl_2", 64, 96, 3)
    layers.conv_bn(f"{name}/branch3x3dbl_3", 96, 96, 3)
    return 384 + 96 + cin  # the max-pool branch passes its input channels through


def _inception_c(layers: _Layers, name: str, cin: int, c7: int) -> int:
    layers.conv_bn(f"{name}/branch1x1", cin, 192, 1)
    layers.conv_bn(f"{name}/branch7x7_1", cin, c7, 1)
    layers.conv_bn(f"{name}/branch7x7_2", c7, c7, (1, 7))
    layers.conv_bn(f"{name}/branch7x7_3", c7, 192, (7, 1))
    layers.conv_bn(f"{name}/branch7x7dbl_1", cin, c7, 1)
    layers.conv_bn(f"{name}/branch7x7dbl_2", c7, c7, (7, 1))
    layers.conv_bn(f"{name}/branch7x7dbl_3", c7, c7, (1, 7))
    layers.conv_bn(f"{name}/branch7x7dbl_4", c7, c7, (7, 1))
    layers.conv_bn(f"{name}/branch7x7dbl_5", c7, 192, (1, 7))
    layers.conv_bn(f"{name}/branch_pool", cin, 192, 1)
    return 4 * 192


def _inception_d(layers: _Layers, name: str, cin: int) -> int:
    layers.conv_bn(f"{name}/branch3x3_1", cin, 192, 1)
    layers.conv_bn(f"{name}/branch3x3_2", 192, 320, 3)
    layers.conv_bn(f"{name}/branch7x7x3_1", cin, 192, 1)
    layers.conv_bn(f"{name}/branch7x7x3_2", 192, 192, (1, 7))
    layers.conv_bn(f"{name}/branch7x7x3_3", 192, 192, (7, 1))
    layers.conv_bn(f"{name}/branch7x7x3_4", 192, 192, 3)
    return 320 + 192 + cin


def _inception_e(layers: _Layers, name: str, cin: int) -> int:
    layers.conv_bn(f"{name}/branch1x1", cin, 320, 1)
    layers.conv_bn(f"{name}/branch3x3_1", cin, 384, 1)
    layers.conv_bn(f"{name}/branch3x3_2a", 384, 384, (1, 3))
    layers.conv_bn(f"{name}/branch3x3_2b", 384, 384, (3, 1))
    layers.conv_bn(f"{name}/branch3x3dbl_1", cin, 448, 1)
    layers.conv_bn(f"{name}/branch3x3dbl_2", 448, 384, 3)
    layers.conv_bn(f"{name}/branch3x3dbl_3a", 384, 384, (1, 3))
    layers.conv_bn(f"{name}/branch3x3dbl_3b", 384, 384, (3, 1))
    layers.conv_bn(f"{name}/branch_pool", cin, 192, 1)
    return 320 + 2 * 384 + 2 * 384 + 192


def inception_v3(num_classes: int = 1000, *, aux_logits: bool = True) -> Layout:
    """Inception-v3 as in ``torchvision.models.inception_v3``: a stem of five bias-free
    convolutions with BatchNorm, modules A (x3), B, C (x4, 7x7 factorised into 1x7 and 7x1), D and
    E (x2), and a dense layer 2048 -> classes. With ``aux_logits`` (torchvision's default, and what
    training uses) the auxiliary head on Mixed_6e is included where torchvision registers it,
    between Mixed_6e and Mixed_7a.
    """
    layers = _Layers()
    layers.conv_bn("Conv2d_1a_3x3", 3, 32, 3)
    layers.conv_bn("Conv2d_2a_3x3", 32, 32, 3)
    layers.conv_bn("Conv2d_2b_3x3", 32, 64, 3)
    layers.conv_bn("Conv2d_3b_1x1", 64, 80, 1)
    layers.conv_bn("Conv2d_4a_3x3", 80, 192, 3)
    cin = 192
    for name, pool_features in (("Mixed_5b", 32), ("Mixed_5c", 64), ("Mixed_5d", 64)):
        cin = _inception_a(layers, name, cin, pool_features)
    cin = _inception_b(layers, "Mixed_6a", cin)
    for name, c7 in (("Mixed_6b", 128), ("Mixed_6c", 160), ("Mixed_6d", 160), ("Mixed_6e", 192)):
        cin = _inception_c(layers, name, cin, c7)
    if aux_logits:
        layers.conv_bn("AuxLogits/conv0", cin, 128, 1)
        layers.conv_bn("AuxLogits/conv1", 128, 768, 5)
        layers.dense("AuxLogits/fc", 768, num_classes)
    cin = _inception_d(layers, "Mixed_7a", cin)
    for name in ("Mixed_7b", "Mixed_7c"):
        cin = _inception_e(layers, name, cin)
    layers.dense("fc", cin, num_classes)
    return layers.layout()


# --- HEP-CNN (Kurth et al. 2017; Mathuriya et al. 2017) ------------------------------------------


def hep_cnn(
    input_channels: int = 3, num_layers: int = 4, num_filters: int = 128, filter_size: int = 3
) -> Layout:
    """The HEP classifier of NERSC's ``hep_cnn_benchmark`` (``binary_classifier_tf.py``,
    ``build_cnn_model``) with its Cori 224x224x3 configuration (``configs/cori_knl_224.json``:
    ``num_layers`` 4, ``num_filters`` 128, ``filter_size`` 3, ``batch_norm`` false,
    ``scaling_improvements`` true).

    ``num_layers`` units of convolution + bias + ReLU + 2x2 max pool, then (the "scaling
    improvements") one more convolution with a global average pool, so the classifier is a single
    dense layer from ``num_filters`` features to 2 classes. Names are the reference's variable
    names (``conv1_w``, ``conv1_b``, ..., ``fc1_w``, ``fc1_b``).
    """
    tensors: list[tuple[str, Shape]] = []
    cin = input_channels
    for layer in range(1, num_layers + 2):
        tensors.append((f"conv{layer}_w", (filter_size, filter_size, cin, num_filters)))
        tensors.append((f"conv{layer}_b", (num_filters,)))
        cin = num_filters
    tensors.append(("fc1_w", (cin, 2)))
    tensors.append(("fc1_b", (2,)))
    return tuple(tensors)


# --- BERT (Devlin et al. 2018) --------------------------------------------------------------------


def bert(
    *,
    vocab_size: int = 30522,
    hidden: int = 768,
    layers_count: int = 12,
    intermediate: int = 3072,
    max_positions: int = 512,
    type_vocab_size: int = 2,
    pooler: bool = True,
) -> Layout:
    """BERT encoder (``BertModel``, no pre-training heads) with the defaults of bert-base-uncased.

    Embeddings (word, position, token type) with LayerNorm; per layer the query/key/value and
    output projections, LayerNorm, the feed-forward pair and another LayerNorm; the pooler. The
    number of attention heads splits ``hidden`` but adds no parameters, so it is not an argument.
    Names are those of Google's TensorFlow checkpoints (``bert/encoder/layer_0/...``), in the
    registration order of HuggingFace ``transformers``.
    """
    layers = _Layers()
    layers.add("bert/embeddings/word_embeddings", vocab_size, hidden)
    layers.add("bert/embeddings/position_embeddings", max_positions, hidden)
    layers.add("bert/embeddings/token_type_embeddings", type_vocab_size, hidden)
    layers.norm("bert/embeddings/LayerNorm", hidden)
    for index in range(layers_count):
        prefix = f"bert/encoder/layer_{index}"
        for projection in ("query", "key", "value"):
            layers.dense(f"{prefix}/attention/self/{projection}", hidden, hidden)
        layers.dense(f"{prefix}/attention/output/dense", hidden, hidden)
        layers.norm(f"{prefix}/attention/output/LayerNorm", hidden)
        layers.dense(f"{prefix}/intermediate/dense", hidden, intermediate)
        layers.dense(f"{prefix}/output/dense", intermediate, hidden)
        layers.norm(f"{prefix}/output/LayerNorm", hidden)
    if pooler:
        layers.dense("bert/pooler/dense", hidden, hidden)
    return layers.layout()


def bert_base() -> Layout:
    """BERT-Base (bert-base-uncased): 12 layers, width 768, 3072 feed-forward, 30522 word pieces."""
    return bert()


# --- tf_cnn_benchmarks (tensorflow/benchmarks, scripts/tf_cnn_benchmarks) -----------------------
#
# TensorFlow's ``replica_device_setter`` places every variable op (trainable or not) on the PS
# tasks round robin in the order the graph creates them, so where a tensor lands depends on every
# variable created before it: ``global_step`` first (``benchmark_cnn.py`` creates it on the
# parameter-server device before the model), then each ``conv`` (``convnet_builder.py``: the
# kernel ``conv2d/kernel``, then its batch norm's ``gamma`` when ``scale=True``, ``beta``,
# ``moving_mean`` and ``moving_variance``, in the order Keras' ``BatchNormalization.build``
# creates them), and the final ``affine`` layer (``weights``, ``biases``) to 1001 classes (the
# ImageNet label set tf_cnn_benchmarks uses, background included).

Variable = tuple[str, Shape, bool]  # name, shape, trainable
Variables = tuple[Variable, ...]


class _TfCnn:
    """Variables in tf_cnn_benchmarks' creation order."""

    def __init__(self, *, bn_scale: bool) -> None:
        self._variables: list[Variable] = [("global_step", (), False)]
        self._bn_scale = bn_scale
        self._convs = 0

    def conv(self, cin: int, cout: int, kh: int, kw: int) -> int:
        name = f"v/cg/conv{self._convs}"
        self._convs += 1
        self._variables.append((f"{name}/conv2d/kernel", (kh, kw, cin, cout), True))
        bn = f"{name}/batchnorm{self._convs - 1}"
        if self._bn_scale:
            self._variables.append((f"{bn}/gamma", (cout,), True))
        self._variables.append((f"{bn}/beta", (cout,), True))
        self._variables.append((f"{bn}/moving_mean", (cout,), False))
        self._variables.append((f"{bn}/moving_variance", (cout,), False))
        return cout

    def affine(self, din: int, dout: int) -> None:
        self._variables.append(("v/cg/affine0/weights", (din, dout), True))
        self._variables.append(("v/cg/affine0/biases", (dout,), True))

    def variables(self) -> Variables:
        return tuple(self._variables)


def tf_cnn_resnet50(num_classes: int = 1001) -> Variables:
    """ResNet-50 v1 as tf_cnn_benchmarks' ``models/resnet_model.py`` builds it: batch norm with
    ``scale=True`` (its ``batch_norm_config``), and in each bottleneck block the projection
    shortcut's convolution (first block of a stage) *before* the three convolutions of the
    residual branch (``bottleneck_block_v1``)."""
    net = _TfCnn(bn_scale=True)
    cin = net.conv(3, 64, 7, 7)
    for depth, bottleneck, count in ((256, 64, 3), (512, 128, 4), (1024, 256, 6), (2048, 512, 3)):
        for _ in range(count):
            if depth != cin:
                net.conv(cin, depth, 1, 1)
            net.conv(cin, bottleneck, 1, 1)
            net.conv(bottleneck, bottleneck, 3, 3)
            cin = net.conv(bottleneck, depth, 1, 1)
    net.affine(cin, num_classes)
    return net.variables()


#: tf_cnn_benchmarks' ``inception_module`` columns: ("conv", out, kh, kw), ("pool",) or
#: ("share",), which reuses the layer at the same depth of the previous column.
_Column = tuple[tuple[object, ...], ...]


def _inception_module(net: _TfCnn, cin: int, columns: Sequence[_Column]) -> int:
    outputs: list[list[int]] = []
    for column in columns:
        channels: list[int] = []
        current = cin
        for depth, layer in enumerate(column):
            if layer[0] == "conv":
                _, cout, kh, kw = layer
                assert isinstance(cout, int) and isinstance(kh, int) and isinstance(kw, int)
                current = net.conv(current, cout, kh, kw)
            elif layer[0] == "share":
                current = outputs[-1][depth]
            channels.append(current)
        outputs.append(channels)
    return sum(column[-1] for column in outputs)


def tf_cnn_inception3(num_classes: int = 1001) -> Variables:
    """Inception-v3 as tf_cnn_benchmarks' ``models/inception_model.py`` builds it (the
    ``inception3`` model, without the auxiliary head): batch norm with the builder's default
    ``scale=False``, so ``beta`` and the moving statistics only."""
    net = _TfCnn(bn_scale=False)
    cin = net.conv(3, 32, 3, 3)
    cin = net.conv(cin, 32, 3, 3)
    cin = net.conv(cin, 64, 3, 3)
    cin = net.conv(cin, 80, 1, 1)
    cin = net.conv(cin, 192, 3, 3)
    pool: tuple[object, ...] = ("pool",)
    share: tuple[object, ...] = ("share",)

    def c(cout: int, kh: int, kw: int) -> tuple[object, ...]:
        return ("conv", cout, kh, kw)

    for n in (32, 64, 64):
        cin = _inception_module(
            net,
            cin,
            (
                (c(64, 1, 1),),
                (c(48, 1, 1), c(64, 5, 5)),
                (c(64, 1, 1), c(96, 3, 3), c(96, 3, 3)),
                (pool, c(n, 1, 1)),
            ),
        )
    cin = _inception_module(
        net,
        cin,
        ((c(384, 3, 3),), (c(64, 1, 1), c(96, 3, 3), c(96, 3, 3)), (pool,)),
    )
    for n in (128, 160, 160, 192):
        cin = _inception_module(
            net,
            cin,
            (
                (c(192, 1, 1),),
                (c(n, 1, 1), c(n, 1, 7), c(192, 7, 1)),
                (c(n, 1, 1), c(n, 7, 1), c(n, 1, 7), c(n, 7, 1), c(192, 1, 7)),
                (pool, c(192, 1, 1)),
            ),
        )
    cin = _inception_module(
        net,
        cin,
        (
            (c(192, 1, 1), c(320, 3, 3)),
            (c(192, 1, 1), c(192, 1, 7), c(192, 7, 1), c(192, 3, 3)),
            (pool,),
        ),
    )
    for _ in range(2):
        cin = _inception_module(
            net,
            cin,
            (
                (c(320, 1, 1),),
                (c(384, 1, 1), c(384, 1, 3)),
                (share, c(384, 3, 1)),
                (c(448, 1, 1), c(384, 3, 3), c(384, 1, 3)),
                (share, share, c(384, 3, 1)),
                (pool, c(192, 1, 1)),
            ),
        )
    net.affine(cin, num_classes)
    return net.variables()
