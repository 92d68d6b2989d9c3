"""The console scripts other than the server and agent: ``tfgrpc-compare``, ``tfgrpc-history``,
``tfgrpc-model`` and ``tfgrpc-fabric``, each a thin ``main`` over the layers below.

Layer: beside ``bench`` (neither imports the other), below ``plugin``; may import ``hosts``,
``ps``, ``report``, ``roles`` and every layer below them, never pytest.
"""
