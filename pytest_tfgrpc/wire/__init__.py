"""What travels on the wire: generated protobuf code, tensors and payload schemes, the codec,
gRPC settings and method paths (``grpc_settings``), clients, fabrics, TLS and the job token.

Layer: beside ``tuning``, ``native`` and ``model`` (none imports another); may import only
``results``, ``metrics``, ``stats`` and ``units``.
"""
