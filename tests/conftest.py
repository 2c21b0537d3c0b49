"""Test order for `make test` (two xdist workers, ``--dist loadfile --no-loadscope-reorder``: each file runs whole
on one worker, in the order collected). The files that take minutes go first, longest first, so that the workers end
together; by default xdist would put the files with the most tests first, and these, which have few long tests,
last, where one worker then runs them alone while the other idles."""

from __future__ import annotations

import pytest

# Longest first: serial seconds on a 2-core box with warm caches (2026-12-07: distributed 125, scripts 97, recipe
# runs 91, agent 90, smollm2 81, alfworld 79, overlap 71, warm start 67, advantages 66, sim2real 62); on a fresh
# checkout the ALFWorld and SmolLM2 files also fill their caches (game translations, the converted model) first.
LONG_FILES = (
    "test_alfworld.py",
    "test_smollm2.py",
    "test_distributed.py",
    "test_recipe_runs.py",
    "test_scripts.py",
    "test_agent.py",
    "test_overlap.py",
    "test_warm_start.py",
    "test_advantages.py",
    "test_sim2real.py",
    "test_rivals.py",
    "test_committed_agents.py",
    "test_imitation.py",
    "test_gpu_check.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the other files keep their order
