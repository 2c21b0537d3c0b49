"""The studies: each a runner on :mod:`lab.study`'s shape beside its settings file."""
