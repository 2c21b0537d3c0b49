"""Benchmarks: the learning benchmark and its setups (``setups/*.yaml``), speed, memory and exactness measurements."""
