"""Roles: the local processes the plugin starts, and the handles that keep them.

- ``processes``: process handles (start, wait until ready, detect death, stop) and the
  launcher seam through which another host's agent starts them
- ``tensor_server``: the tensor server process (``tfgrpc-server``)
- ``parameter_server``: the parameter-server service a tensor server hosts as a PS task
- ``floor_server``: the raw-TCP floor server
- ``native_server``: the native (C++) tensor server as a process, and the choice of engine
- ``tf_task``: a task of TensorFlow's own runtime, run as a script by TensorFlow's Python

Layer: below ``hosts``, ``ps`` and ``report``; may import ``tuning``, ``native``, ``model``,
``wire``, ``results``, ``metrics``, ``stats`` and ``units``, nothing above.
"""
