"""The estimator registry (agents.advantages.REGISTRY): each estimator declared once, and read everywhere from there.

Adding an estimator is one function and one entry: a toy entry registered here trains through the buffer, passes
the config's checks and shows in the command line's choices with no other change. Every entry's config fields
exist in GAGPOConfig (a saved agent's agent.json names them), and docs/api/estimators.md's table is the registry's.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
from pathlib import Path

import numpy as np
import pytest

from agents.advantages import INPUTS, REGISTRY, Estimator
from agents.buffer import GroupRolloutBuffer, Row
from agents.cli import add_config_arguments
from agents.config import ESTIMATORS, GAGPOConfig
from agents.state_sets import check_layout

ROOT = Path(__file__).resolve().parents[1]
CONFIG_FIELDS = {f.name: f for f in dataclasses.fields(GAGPOConfig)}


def toy_advantages(rewards, episode_index, group_index, *, scale: float = 1.0) -> np.ndarray:
    """Each row's reward minus its group's mean reward, times ``scale``: an estimator a test can check by hand."""
    r, _, grp = check_layout(rewards, episode_index, group_index)
    mean = np.bincount(grp, weights=r) / np.bincount(grp)
    return scale * (r - mean[grp])


TOY = Estimator(
    "toy", toy_advantages, "the reward against the group's mean reward",
    inputs=("rewards", "episode_index", "group_index"), config={"scale": "omega"}, needs_group=True,
)  # fmt: skip


def fill(buffer: GroupRolloutBuffer, rewards: dict[int, list[float]]) -> None:
    """One group (0) with one episode per key of ``rewards``, rows interleaved as the vector env gives them."""
    buffer.start_group(0, list(rewards))
    for t in range(max(map(len, rewards.values()))):
        for episode, steps in rewards.items():
            if t < len(steps):
                last = t == len(steps) - 1
                buffer.add(
                    Row(group=0, episode=episode, prompt_ids=[t], rollout_logp=np.zeros(1), reward=steps[t],
                        state_key=t, next_state_key=t + 1, terminated=last, done=last, won=last and steps[t] > 0)
                )  # fmt: skip


def test_adding_an_estimator_is_one_entry(monkeypatch):
    monkeypatch.setitem(REGISTRY, "toy", TOY)
    config = GAGPOConfig(estimator="toy", omega=2.0, group_size=2)
    buffer = GroupRolloutBuffer(config)
    fill(buffer, {0: [0.0, 1.0], 1: [0.0, 0.0, 0.5]})
    buffer.finalize()
    mean = 1.5 / 5
    by_row = {(r.episode, r.prompt_ids[0]): r.advantage for r in buffer.rows}
    expected = {(0, 0): -mean, (0, 1): 1 - mean, (1, 0): -mean, (1, 1): -mean, (1, 2): 0.5 - mean}
    assert by_row == pytest.approx({k: 2.0 * v for k, v in expected.items()}, abs=1e-12)
    assert all(r.value_target == 0.0 for r in buffer.rows)  # no critic: no value targets

    with pytest.raises(ValueError, match="estimator 'toy' needs group_size >= 2"):  # needs_group is checked
        GAGPOConfig(estimator="toy", group_size=1)
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    assert parser.parse_args(["--estimator", "toy"]).estimator == "toy"  # scripts/train.py --estimator takes it


def test_every_entry_reads_config_fields_that_exist():
    """The registry maps to GAGPOConfig's field names as they are: saved agents' agent.json store them."""
    for spec in REGISTRY.values():
        missing = [name for name in spec.config_fields if name not in CONFIG_FIELDS]
        assert not missing, f"{spec.name} reads {missing}, which GAGPOConfig lacks"
        settings = spec.settings(GAGPOConfig(estimator=spec.name))
        assert set(settings) == set(spec.config)
        params = inspect.signature(spec.function).parameters
        assert set(spec.inputs) <= set(params) and set(spec.config) <= set(params), spec.name
        assert set(spec.inputs) <= set(INPUTS), spec.name


def test_the_settings_of_the_rivals_and_gagpo_come_from_their_fields():
    c = GAGPOConfig(estimator="hgpo", history_length=3, hgpo_alpha=0.5, adv_eps=1e-3)
    assert REGISTRY["hgpo"].settings(c)["history"] == 3  # hgpo_history=-1: the prompt's history_length
    assert REGISTRY["hgpo"].settings(dataclasses.replace(c, hgpo_history=1))["history"] == 1
    assert REGISTRY["hgpo"].settings(c)["alpha"] == 0.5 and REGISTRY["hgpo"].settings(c)["eps"] == 1e-3
    g = GAGPOConfig(omega=0.3, graphgpo_episode_coef=0.7)
    assert {k: REGISTRY["graphgpo"].settings(g)[k] for k in ("step_coef", "episode_coef")} == {
        "step_coef": 0.3,
        "episode_coef": 0.7,
    }
    assert REGISTRY["ppo"].settings(GAGPOConfig(gae_lambda=0.9))["lam"] == 0.9
    assert REGISTRY["gagpo"].batch_normalized(GAGPOConfig(normalize="batch"))
    assert not REGISTRY["gagpo"].batch_normalized(GAGPOConfig())
    assert REGISTRY["ppo"].batch_normalized(GAGPOConfig(estimator="ppo"))


def test_the_flags_say_what_each_estimator_needs():
    assert tuple(REGISTRY) == ESTIMATORS
    assert ESTIMATORS == ("gagpo", "gigpo", "grpo", "rloo", "ppo", "hgpo", "graphgpo", "g2po", "self_imitation")
    assert {n for n, e in REGISTRY.items() if e.needs_group} == {"grpo", "rloo"}
    assert {n for n, e in REGISTRY.items() if e.needs_critic} == {"ppo"}
    assert {n for n, e in REGISTRY.items() if e.needs_success} == {"graphgpo", "g2po", "self_imitation"}
    assert CONFIG_FIELDS["estimator"].metadata["help"] == " | ".join(REGISTRY)


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"inputs": ("rewards", "episode_index", "state_keys")}, "takes no 'state_keys'"),
        ({"config": {"gain": "omega"}}, "takes no 'gain'"),
        ({"auto": {"rate": "history_length"}}, "auto 'rate' is not a config keyword"),
        ({"needs_critic": True}, "needs_critic and reading 'values' go together"),
    ],
)
def test_a_malformed_entry_fails_where_it_is_declared(entry, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(TOY, **entry)


def test_the_docs_table_is_the_registry():
    text = (ROOT / "docs" / "api" / "estimators.md").read_text()
    for spec in REGISTRY.values():
        flags = (("a group of 2+", spec.needs_group), ("a critic", spec.needs_critic), ("success", spec.needs_success))
        needs = ", ".join(label for label, on in flags if on) or "-"
        fields = ", ".join(f"`{name}`" for name in spec.config_fields) or "-"
        row = f"| `{spec.name}` | `{spec.function.__name__}` | {fields} | {needs} | {spec.description} |"
        assert row in text, f"docs/api/estimators.md lacks (or has another) row for {spec.name}:\n{row}"
    assert text.count("\n| `") == len(REGISTRY)
