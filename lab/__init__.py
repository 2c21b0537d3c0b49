"""The lab: the studies, benchmarks, research probes and tables that measure the library, apart from it.

It imports ``gagpo_gym``, ``wrappers`` and ``agents``; they never import it (an import contract in pyproject.toml),
so the library keeps only what a user calls and installs without it. Its commands run from the repository root as
modules (``python -m lab.studies.alfworld_compare report``), except the three that measure the checkout named by
``PYTHONPATH`` (``lab/bench/fingerprint.py``, ``throughput.py``, ``memory.py``), which run by path.
"""
