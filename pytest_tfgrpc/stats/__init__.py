"""Statistics of samples: summaries and percentiles, sketches, significance and replicate tests.

Layer: the bottom, beside ``units`` (neither imports the other); imports nothing of the package.
"""
