"""Prompt templates (verl-agent's structure, or a user's file) and verl-agent's response-format rule.

The ALFWorld template is rendered for a real game from ../shared/alfworld after three steps through the agent's
own wrappers and compared with the text it must be; a user's template file renders its placeholders, names a bad
one, and travels with a saved agent; predict() in a plain loop counts the episode's steps from its state.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import pytest

from agents import GAGPOAgent, GAGPOConfig
from agents.tiny import train_tokenizer
from wrappers import PromptBuilder, PromptTemplate, follows_think_format, prompt_template, wrap_text_env

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "alfworld"
THINK_THEN_ACT = (
    "Now it is your turn to act.\n"
    "First reason step by step about the current situation; enclose this reasoning in <think> </think> tags.\n"
    "Then choose one admissible action for the current step and give it inside <action> </action> tags."
)
AGENT = {"num_groups": 1, "group_size": 2, "torch_threads": 1, "verbose": 0, "tiny_hidden_size": 32}


@pytest.mark.skipif(not (DATA / "json_2.1.1" / "valid_unseen").is_dir(), reason="../shared/alfworld is absent")
def test_the_alfworld_template_renders_every_field_of_a_real_game() -> None:
    env = wrap_text_env(
        gym.make("gagpo_gym/ALFWorld-v0", split="valid_unseen", data_root=str(DATA)), history_length=2, tagged=True
    )
    obs, info = env.reset(seed=3)
    seen, played = [obs], []
    for _ in range(3):
        command = [a for a in info["admissible_actions"] if a.startswith("go to")][0]
        obs, _, _, _, info = env.step(f"<think>look around</think><action>{command}</action>")
        seen.append(obs)
        played.append(command)
    assert info["episode_step"] == 3
    tokenizer = train_tokenizer([*seen, info["task"], *info["admissible_actions"]], 1024)
    builder = PromptBuilder(tokenizer, "generate", max_prompt_tokens=4096, template=prompt_template("alfworld"))
    prompt = tokenizer.decode(builder.for_step(obs, info))
    listed = ", ".join(f"'{a}'" for a in info["admissible_actions"] if a != "help")
    expected = (
        f"You are an expert agent in the ALFRED embodied household environment. Your task is to: {info['task']}\n"
        "Before this step you have taken 3 step(s). Your 2 most recent observations and the actions you took after "
        "them:\n"
        f"[Observation 2: '{seen[1]}', Action 2: '{played[1]}']\n"
        f"[Observation 3: '{seen[2]}', Action 3: '{played[2]}']\n"
        f"You are now at step 4 and your current observation is: {seen[3]}\n"
        f"Your admissible actions in the current situation are: [{listed}].\n\n{THINK_THEN_ACT}"
    )
    # One user message, no system message of the builder's (verl-agent sends none: the chat template's default).
    assert prompt == f"<|im_start|>user\n{expected}<|im_end|>\n<|im_start|>assistant\n"
    # The first step has nothing to show: the observation (which holds the task) and the actions.
    obs, info = env.reset(seed=3)
    first = builder.user_message(info["task"], [], obs, info["admissible_actions"], step_count=0)
    assert first.startswith(f"You are an expert agent in the ALFRED embodied household environment.\n"
                            f"Your current observation is: {obs}\n")  # fmt: skip
    assert first.endswith(THINK_THEN_ACT)
    # verl-agent never lists ALFWorld's help command (this env does not offer it; TextWorld's own list can).
    assert prompt_template("alfworld").fields("t", [], "o", ["help", "look"], "", 0)["admissible_actions"] == "'look'"


def test_a_template_file_renders_its_placeholders_and_names_a_bad_one(tmp_path: Path) -> None:
    path = tmp_path / "mine.txt"
    path.write_text("Goal: {task}. Look: {observation}\n---\nGoal: {task}. Step {current_step} after {step_count}:\n"
                    "{history}\nNow: {observation} {{literal}} [{admissible_actions}]\n")  # fmt: skip
    template = PromptTemplate.from_file(path)
    assert PromptTemplate.from_file(path).text() == template.text() and template.text().count("---") == 1
    fields = template.fields("win", [["o1", "a1"]], "o2", ["x", "y"], "", step_count=4)
    assert template.render(fields) == "Goal: win. Step 5 after 4:\n[Observation 4: 'o1', Action 4: 'a1']\n" \
                                      "Now: o2 {literal} ['x', 'y']"  # fmt: skip
    assert template.render(template.fields("win", [], "o0", ["x"], "", step_count=0)) == "Goal: win. Look: o0"
    path.write_text("Goal: {goal}")
    with pytest.raises(ValueError, match=r"unknown placeholders \['goal'\]"):
        PromptTemplate.from_file(path)
    path.write_text("a { lone brace")
    with pytest.raises(ValueError, match="literal braces"):
        PromptTemplate.from_file(path)
    with pytest.raises(ValueError, match="prompt_template must be 'generic'"):
        GAGPOConfig(prompt_template=str(tmp_path / "missing.txt")).validate()


def test_verl_agents_format_rule_penalises_once_and_still_plays_the_action() -> None:
    assert follows_think_format("<think>go</think><action>left</action>")
    assert not follows_think_format("<action>left</action>")
    assert not follows_think_format("<think>向左</think><action>left</action>")

    def play(strict: bool, response: str) -> tuple[str, float, dict]:
        env = wrap_text_env(gym.make("gagpo_gym/FrozenLake-v0"), penalty=0.25, tagged=True, strict_format=strict)
        env.reset(seed=0)
        obs, reward, _, _, info = env.step(response)
        return obs, float(reward), info

    moved, _, _ = play(False, "<think>south</think><action>go south</action>")
    assert "row 2, column 1" in moved
    obs, reward, info = play(True, "<action>go south</action>")  # no think block: penalised, unparsed, but played
    assert obs == moved and reward == -0.25 and info["action_valid"] and not info["action_parsed"]
    assert play(True, "<think>走</think><action>go south</action>")[1] == -0.25
    assert play(True, "<think>south</think><action>go south</action>")[1] == 0.0
    assert play(False, "<action>go south</action>")[1] == 0.0  # the rule is opt-in
    _, reward, info = play(True, "<action>fly</action>")  # rejected by the env too: one penalty, not two
    assert reward == -0.25 and not info["action_valid"]


def test_predict_in_a_plain_loop_counts_the_episodes_steps_from_its_state(tmp_path: Path) -> None:
    path = tmp_path / "count.txt"
    path.write_text("Step {current_step} of the episode, {history_length} shown. {observation}")
    lake = {"map_size": 8, "frozen_prob": 1.0}  # no holes, the goal 14 steps away: three steps stay on the lake
    agent = GAGPOAgent("gagpo_gym/FrozenLake-v0", env_kwargs=lake, prompt_template=str(path), history_length=1, **AGENT)
    messages: list[str] = []
    real = agent.prompts.user_message
    agent.prompts.user_message = lambda *a, **k: messages.append(real(*a, **k)) or messages[-1]
    env = gym.make("gagpo_gym/FrozenLake-v0", **lake)
    obs, info = env.reset(seed=0)
    state, start = None, True
    for _ in range(3):
        action, state = agent.predict(obs, info, state=state, episode_start=start, deterministic=True)
        obs, _, terminated, truncated, info = env.step(action)
        start = False
        assert not (terminated or truncated)
    assert [m.split(" of")[0] for m in messages] == ["Step 1", "Step 2", "Step 3"]
    assert "1 shown" in messages[-1] and len(state) == 3  # history 1, the state holds the whole episode

    # A saved agent keeps its template's text: it loads where the file is gone.
    agent.save(tmp_path / "agent")
    path.unlink()
    loaded = GAGPOAgent.load(tmp_path / "agent", verbose=0)
    assert loaded.prompts.template.text() == agent.prompts.template.text()
