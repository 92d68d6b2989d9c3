"""Other hosts: node agents, their clients, cluster specs, SLURM allocations, emulated fabrics.

- ``agent``: the node agent (``tfgrpc-node``) that starts the plugin's roles on its host
- ``agent_client``: the driver's client of an agent, and remote processes that look local
- ``cluster_spec``: tensor servers on other hosts, named by a TF_CONFIG-style cluster spec
- ``slurm``: a SLURM allocation's nodes, and an agent on each
- ``emulated``: emulated hosts on one machine (network namespaces, rate-capped links)

Layer: beside ``ps`` and ``report`` (none imports another); may import ``roles`` and the layers
below it (``tuning``, ``native``, ``model``, ``wire``, ``results``, ``metrics``, ``stats``,
``units``). An agent starts roles by module path, never by importing ``ps``.
"""
