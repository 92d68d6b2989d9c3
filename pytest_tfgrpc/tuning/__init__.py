"""Host tuning that shapes figures: CPU placement (``cpus``), the allocator policy (``allocator``).

Layer: beside ``native``, ``model`` and ``wire`` (none imports another); may import only
``results``, ``metrics``, ``stats`` and ``units`` (today it imports nothing of the package).
"""
