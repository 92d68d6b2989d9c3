"""Models of training traffic: architectures and profiles, PS placement, the analytic model.

Layer: beside ``tuning``, ``native`` and ``wire`` (none imports another); may import only
``results``, ``metrics``, ``stats`` and ``units``.
"""
