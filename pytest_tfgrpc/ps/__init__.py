"""Parameter-server clusters: PS tasks and workers as processes, and the job protocol between them.

- ``ps_cluster``: a PS cluster on one fabric (P tensor servers as PS tasks, W workers)
- ``worker``: the worker process (``python -m pytest_tfgrpc.ps.worker``)
- ``jobs``: the typed messages between a cluster's driver and its workers
- ``tf_cluster``: TensorFlow's own runtime as a cluster of ``roles.tf_task`` processes

Layer: beside ``hosts`` and ``report`` (none imports another); may import ``roles`` and the
layers below it (``tuning``, ``native``, ``model``, ``wire``, ``results``, ``metrics``,
``stats``, ``units``).
"""
