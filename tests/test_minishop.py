"""MiniShop: WebShop's reward branch by branch, the pages and actions, the expert, search quality, the fixed
goal splits, the loader for real WebShop files, and the env contract (checkers, vector envs, bad input)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import gagpo_gym
from gagpo_gym.envs.minishop import MiniShopEnv, generated_catalog, search_candidates
from gagpo_gym.envs.minishop.catalog import TEST_GOALS, load_webshop
from gagpo_gym.envs.minishop.reward import (
    get_attribute_reward,
    get_option_reward,
    get_reward,
    get_type_reward,
    name_nouns,
    normalize_color,
)

ENV_ID = "gagpo_gym/MiniShop-v0"
SEP = "\u203a"


# ----- reward: every branch of WebShop's formula on hand-made products ----------------------------------
def product(**overrides) -> dict:
    base = {
        "asin": "B000000001",
        "query": "hair oil",
        "name": "Lumo Argan Hair Oil, Dry Hair",
        "Title": "Lumo Argan Hair Oil, Dry Hair",
        "product_category": f"Beauty {SEP} Hair Care {SEP} Hair Oils",
        "Attributes": ["paraben free", "shine boost"],
        "BulletPoints": ["HEAT PROTECTION: keeps hair safe."],
        "Description": "A light oil with vitamin e.",
    }
    return {**base, **overrides}


def goal(**overrides) -> dict:
    base = {
        "asin": "B000000001",
        "query": "hair oil",
        "name": "Lumo Argan Hair Oil, Dry Hair",
        "product_category": f"Beauty {SEP} Hair Care {SEP} Hair Oils",
        "attributes": ["paraben free"],
        "goal_options": {"size": "4 fl oz"},
        "price_upper": 30.0,
    }
    return {**base, **overrides}


def test_type_reward_branches() -> None:
    desired = "Lumo Argan Hair Oil Drops"  # 5 nouns; "Vera Oil Shampoo" shares one: title score 0.2, not > 0.2
    shampoo = {"query": "shampoo", "name": "Vera Oil Shampoo", "product_category": f"Beauty {SEP} Shampoos"}
    # 1: the same query and shared nouns
    assert get_type_reward(product(), goal())["r_type"] == 1.0
    # 1: a weak title score is rescued by the query, or by two common category levels
    info = get_type_reward(product(**{**shampoo, "query": "hair oil"}), goal(name=desired))
    assert info["query_match"] and info["title_score"] == pytest.approx(0.2) and info["r_type"] == 1.0
    in_hair_care = f"Beauty {SEP} Hair Care {SEP} Shampoos"
    info = get_type_reward(product(**{**shampoo, "product_category": in_hair_care}), goal(name=desired))
    assert info["category_match"] and not info["query_match"] and info["r_type"] == 1.0
    # 1: or by a title score above 0.2 alone
    info = get_type_reward(product(**{**shampoo, "name": "Vera Hair Oil Shampoo"}), goal(name=desired))
    assert info["title_score"] == pytest.approx(0.4) and info["r_type"] == 1.0
    # 0.5: some noun overlap but no query, category or > 20% title match
    info = get_type_reward(product(**shampoo), goal(name=desired))
    assert not info["query_match"] and not info["category_match"] and info["r_type"] == 0.5
    # 0.1: under 10% of the desired nouns (1 of 11), whatever else matches
    long_name = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda"
    info = get_type_reward(product(name="lambda widget"), goal(name=long_name))
    assert 0 < info["title_score"] < 0.1 and info["r_type"] == 0.1
    # 0: no noun in common, even with the same query and category
    info = get_type_reward(product(name="Vera Shampoo"), goal())
    assert info["query_match"] and info["category_match"] and info["r_type"] == 0.0
    # a goal name without nouns scores 0.2 (WebShop's default), so the query decides
    assert get_type_reward(product(), goal(name="500 100"))["r_type"] == 1.0
    assert get_type_reward(product(**shampoo), goal(name="500 100"))["r_type"] == 0.5


def test_name_nouns_substitute_takes_the_head_of_the_title() -> None:
    assert name_nouns("Lumo Argan Hair Oil for Dry Hair, Paraben Free, 4 Fl Oz") == ["lumo", "argan", "hair", "oil"]
    assert name_nouns("Men's T-Shirt (Pack of 3) - Cotton") == ["men's", "t-shirt"]
    assert name_nouns("The 24K Gold Set") == ["gold", "set"]


def test_attribute_reward_fuzzy_and_substring_branches() -> None:
    p = product()
    # fuzzy: token-set ratio > 85 with one of the product's attributes, after lower-casing and punctuation
    # removal; a token subset scores 100 ("Paraben-Free formula" is in no text of the product)
    for attr in ("Paraben-Free formula", "paraben free", "free", "shine boosts"):  # the last one: 95.7
        assert get_attribute_reward(p, goal(attributes=[attr])) == (1.0, 1), attr
    assert get_attribute_reward(p, goal(attributes=["sulfate free"])) == (0.0, 0)  # ratio 58
    # substring of the title, the bullet points or the description (no attribute is close)
    for attr in ("dry hair", "heat protection", "vitamin e"):
        assert get_attribute_reward(p, goal(attributes=[attr])) == (1.0, 1), attr
    assert get_attribute_reward(p, goal(attributes=["Dry Hair"])) == (0.0, 0)  # the substring test is exact
    assert get_attribute_reward(p, goal(attributes=["paraben free", "curly hair", "dry hair"])) == (2 / 3, 2)


def test_option_reward_normalises_colours_and_fuzzy_matches() -> None:
    assert normalize_color("dark navy blue") == "blue"  # the first colour word in WebShop's list order
    assert normalize_color("rose gold") == "gold"
    assert normalize_color("x-large") == "x-large"
    assert get_option_reward(["navy blue"], ["light blue"])[1] == 1  # both become "blue"
    assert get_option_reward(["red"], ["blue"])[1] == 0
    assert get_option_reward(["12 ounce (pack of 2)"], ["12 Ounce, Pack of 2"])[1] == 1
    assert get_option_reward(["small"], ["x-small"])[1] == 1  # token subset: ratio 100, as in WebShop
    assert get_option_reward(["16 ounce"], ["12 ounce"])[1] == 1  # ratio 87.5: WebShop's fuzzy leniency
    assert get_option_reward(["2 pound"], ["12 ounce"])[1] == 0
    assert get_option_reward(["large", "black"], ["black", "medium", "large"]) == (pytest.approx(2 / 3), 2)
    assert get_option_reward([], []) == (None, 0)


def test_total_reward_formula_and_price() -> None:
    p = product()
    g = goal(attributes=["paraben free", "curly hair"], goal_options={"size": "4 fl oz", "color": "red"})
    # attrs 1/2, options 1/2, price ok: (1 + 1 + 1) / (2 + 2 + 1)
    assert get_reward(p, g, 20.0, {"size": "4 fl oz", "color": "green"}) == pytest.approx(3 / 5)
    # price above the bound loses its point
    assert get_reward(p, g, 30.01, {"size": "4 fl oz", "color": "green"}) == pytest.approx(2 / 5)
    assert get_reward(p, g, 30.0, {"size": "4 fl oz", "color": "green"}) == pytest.approx(3 / 5)  # <= is ok
    # everything matched -> 1; the type factor scales the total
    full = goal(attributes=["paraben free"], goal_options={"size": "4 fl oz"})
    assert get_reward(p, full, 10.0, {"size": "4 fl oz"}) == 1.0
    half = product(query="shampoo", name="Vera Oil Shampoo", product_category=f"Beauty {SEP} Shampoos")
    assert get_reward(half, goal(name="Lumo Argan Hair Oil Drops"), 10.0, {"size": "4 fl oz"}) == pytest.approx(0.5)
    # human goals keep options as a list; verbose gives the parts
    total, info = get_reward(p, goal(goal_options=["4 fl oz"]), 10.0, {"size": "4 fl oz"}, verbose=True)
    assert total == 1.0 and info["r_type"] == 1.0 and info["r_att"] == 1.0 and info["r_price"] is True


# ----- catalog, goals and splits -------------------------------------------------------------------------
def goals_digest(split: str) -> str:
    """Hash of the split's goals and of the products they point to (titles, prices, options, attributes)."""
    env = MiniShopEnv(split=split)
    goals = [[g["asin"], g["instruction_text"], g["goal_options"], g["price_upper"]] for g in env.goals]
    products = [[p["asin"], p["Title"], p["price"], p["options"], p["Attributes"]] for p in env.catalog.products]
    text = json.dumps([goals, products], sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def test_catalog_schema_and_counts() -> None:
    catalog = generated_catalog(3000)
    assert len(catalog.products) == 3000 and len(catalog.by_asin) == 3000
    assert len(catalog.goals) > 5000
    categories = {p["category"] for p in catalog.products}
    assert categories == {"beauty", "grocery", "fashion", "electronics", "furniture"}
    for p in catalog.products[:50]:
        assert len(p["asin"]) == 10 and p["asin"].startswith("B0")
        assert p["product_category"].count(SEP) >= 2 and p["options"] and p["Attributes"]
        assert p["BulletPoints"] and p["Description"] and p["Price"].startswith("$")
        assert min(p["pricing"]) <= p["price"] <= max(p["pricing"])
    for g in catalog.goals[:50]:
        target = catalog.by_asin[g["asin"]]
        assert g["instruction_text"].endswith("dollars") and 2 <= len(g["attributes"]) <= 3
        assert set(g["goal_options"]) == set(target["options"]) and g["price_upper"] >= target["price"]


def test_splits_are_fixed_disjoint_and_identical_across_processes() -> None:
    test, train = MiniShopEnv(split="test").goals, MiniShopEnv(split="train").goals
    assert len(test) == TEST_GOALS and len(train) > 4000
    assert not {g["instruction_text"] for g in test} & {g["instruction_text"] for g in train}
    code = (
        "import sys; sys.path.insert(0, 'tests'); from test_minishop import goals_digest; "
        "print(goals_digest('test'), goals_digest('train'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split() == [goals_digest("test"), goals_digest("train")]


# ----- search, pages, actions ----------------------------------------------------------------------------
def test_search_ranks_each_test_goals_product_in_the_top_10() -> None:
    env = MiniShopEnv(split="test")
    hits = 0
    for g in env.goals:
        results = env.shop.search(search_candidates(g)[0][len("search[") : -1])
        hits += g["asin"] in results[:10]
    assert hits / len(env.goals) >= 0.95  # measured: 98%


def test_pages_render_webshop_text_and_clicks_navigate() -> None:
    env = MiniShopEnv(split="test")
    obs, info = env.reset(seed=0)
    assert obs.startswith("WebShop [SEP] Instruction: [SEP] ") and obs.endswith("[SEP] Search")
    assert all(a.startswith("search[") for a in info["admissible_actions"])
    obs, _, _, _, info = env.step("search[Gluten Free  Snack]")  # any query, any case
    assert info["action_valid"] and env.state.query == "gluten free snack"
    assert "Page 1 (Total results: 50)" in obs and "Next >" in obs and "< Prev" not in obs
    first_page = [a for a in info["admissible_actions"] if a not in ("click[back to search]", "click[next >]")]
    assert len(first_page) == 10 and all(a[6:-1].upper() in obs for a in first_page)
    obs, _, _, _, info = env.step("click[Next >]")
    assert "Page 2 (Total results: 50)" in obs and "click[< prev]" in info["admissible_actions"]
    asin = info["admissible_actions"][-1][6:-1]
    obs, _, _, _, info = env.step(f"click[{asin.upper()}]")
    assert env.state.page == "item" and env.state.asin == asin.upper()
    item = env.catalog.by_asin[asin.upper()]
    assert item["Title"] in obs and f"Price: {item['Price']}" in obs and obs.endswith("Buy Now")
    for value in (v for vs in item["options"].values() for v in vs):
        assert f"click[{value}]" in info["admissible_actions"]
    item_key = info["state_key"]
    obs, _, _, _, info = env.step("click[features]")
    assert env.state.page == "sub" and item["BulletPoints"][0] in obs
    assert info["admissible_actions"] == ["click[back to search]", "click[< prev]"]
    _, _, _, _, info = env.step("click[< prev]")
    assert info["state_key"] == item_key  # the same page state by another path has the same key
    name, values = next(iter(item["options"].items()))
    obs, _, _, _, info = env.step(f"click[{values[-1]}]")
    assert env.state.chosen() == {name: values[-1]} and info["state_key"] != item_key
    assert f"Selected: {name}: {values[-1]}" in obs
    _, _, _, _, info = env.step("click[< prev]")
    assert env.state.page == "results" and env.state.page_no == 2 and env.state.options == ()
    _, _, _, _, info = env.step("click[back to search]")
    assert env.state.page == "search"


def test_buy_now_ends_with_webshop_reward_and_done_page_is_final() -> None:
    env = gym.make(ENV_ID, split="test")
    obs, info = env.reset(seed=5)
    u = env.unwrapped
    env.step(search_candidates(u.goal)[-1])  # the bare product type: the target may be anywhere
    _, _, _, _, info = env.step(info_first_product(env))
    obs, reward, terminated, truncated, info = env.step("click[buy now]")
    product = u.catalog.by_asin[u.state.asin]
    assert terminated and not truncated and "Your score (min 0.0, max 1.0)" in obs
    assert reward == info["score"] == pytest.approx(get_reward(product, u.goal, product["price"], {}))
    assert info["won"] == (reward == 1.0) and info["admissible_actions"] == ["click[back to search]"]
    key = info["state_key"]
    obs2, reward2, terminated2, _, info2 = env.step("click[back to search]")
    assert (obs2, reward2, terminated2, info2["state_key"]) == (obs, 0.0, True, key)


def info_first_product(env: gym.Env) -> str:
    return next(a for a in env.unwrapped.admissible_actions() if a[6:8] == "b0")


def test_fuzzed_actions_never_raise_and_change_nothing() -> None:
    env = MiniShopEnv(split="train")
    rng = np.random.default_rng(0)
    alphabet = list("abcxyz[]<> 0123456789.-_/")  # cannot spell "click[" or "search[": always invalid
    env.reset(seed=11)
    for step in range(60):
        before = (env.state, env.state_string(), env.admissible_actions())
        bad = [
            None,
            42,
            "",
            "   ",
            "click",
            "click[]",
            "click[nothing here]",
            "click[b0zzzzzzzz]",
            "search[]",
            "search[  ]",
            "search shoes",
            "search[shoes" if env.state.page == "search" else "search[shoes]",
            "buy now",
            "x" * 5000,
            "".join(rng.choice(alphabet, size=int(rng.integers(1, 12)))),
        ]
        if env.state.page != "item":
            bad.append("click[buy now]")
        for action in bad:
            obs, reward, terminated, truncated, info = env.step(action)
            assert info["action_valid"] is False, action
            assert (reward, terminated, truncated, obs) == (0.0, False, False, env.invalid_feedback)
            assert (env.state, env.state_string(), env.admissible_actions()) == before
        admissible = env.admissible_actions()
        _, _, terminated, _, _ = env.step(admissible[int(rng.integers(len(admissible)))].upper())
        if terminated:
            env.reset(seed=step)


def test_expert_reaches_score_one_on_500_test_goals() -> None:
    env = gym.make(ENV_ID, split="test")
    scores, steps = [], []
    for seed in range(TEST_GOALS):
        _, info = env.reset(seed=seed)
        assert env.unwrapped.goal_index == seed  # seed s -> goal s, WebShop's session index
        for t in range(1, 16):  # noqa: B007 (t is the episode length)
            action = env.unwrapped.expert_action()
            assert action in info["admissible_actions"]
            _, reward, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                break
        scores.append(info.get("score", 0.0))
        steps.append(t)
    success = np.mean(np.array(scores) == 1.0)
    assert success >= 0.95, f"expert success {success:.3f}"  # measured: 1.000
    assert max(steps) <= 15


def test_determinism_same_seed_same_episode() -> None:
    def rollout(seed: int) -> list:
        env = MiniShopEnv(split="train")
        rng = np.random.default_rng(seed)
        obs, info = env.reset(seed=seed)
        out = [(obs, info["state_key"], tuple(info["admissible_actions"]), info["task_id"])]
        for _ in range(12):
            actions = info["admissible_actions"]
            obs, _, terminated, _, info = env.step(actions[int(rng.integers(len(actions)))])
            out.append((obs, info["state_key"], tuple(info["admissible_actions"])))
            if terminated:
                break
        return out

    assert rollout(3) == rollout(3)
    assert rollout(3)[0] != rollout(4)[0]
    env = MiniShopEnv(split="train")
    env.reset()
    first = env.task_id
    assert any(env.reset()[1]["task_id"] != first for _ in range(5))  # no seed: the next task from the RNG


def test_constructor_and_reset_errors_are_readable() -> None:
    for kwargs in ({"split": "dev"}, {"catalog_size": 10}, {"catalog_size": "big"}, {"data_path": 3}):
        with pytest.raises(ValueError):
            MiniShopEnv(**kwargs)
    with pytest.raises(ValueError, match="items_shuffle"):
        MiniShopEnv(data_path="/")
    env = MiniShopEnv(split="test")
    with pytest.raises(ValueError, match="goal_index"):
        env.reset(options={"goal_index": TEST_GOALS})
    env.reset(options={"goal_index": 7})
    assert env.goal is env.goals[7]


# ----- the contract ---------------------------------------------------------------------------------------
def test_check_env_and_check_text_env() -> None:
    env = gym.make(ENV_ID)
    check_env(env.unwrapped, skip_render_check=True)
    gagpo_gym.check_text_env(env, n_steps=60)
    assert env.spec.max_episode_steps == 15
    _, info = env.reset(seed=1)
    assert info["task_type"] in {"beauty", "grocery", "fashion", "electronics", "furniture"}


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_make_vec(mode: str) -> None:
    kwargs = {"vector_kwargs": {"shared_memory": False}} if mode == "async" else {}
    vec = gym.make_vec(ENV_ID, num_envs=2, vectorization_mode=mode, **kwargs)
    try:
        obs, info = vec.reset(seed=[4, 9])
        single = gym.make(ENV_ID)
        assert obs[1] == single.reset(seed=9)[0]
        actions = [info["admissible_actions"][i][0] for i in range(2)]
        obs, reward, terminated, truncated, info = vec.step(actions)
        assert all(o.startswith("Instruction: [SEP] ") for o in obs) and info["action_valid"].all()
    finally:
        vec.close()


# ----- real WebShop files -----------------------------------------------------------------------------------
def write_webshop_files(path, human: bool) -> None:
    """A small catalog in WebShop's raw schemas: 30 products, each with 5 colours x 5 sizes."""
    colors, sizes = ["Black", "Navy/Blue", "Red", "Olive Green", "White"], ["S", "M", "L", "XL", "XXL"]
    items, ins, human_ins = [], {}, {}
    for i in range(30):
        asin = f"B0TEST{i:04d}"
        items.append(
            {
                "asin": asin,
                "category": "fashion",
                "query": "Men's Hoodie ",
                "name": f"Brand{i} Caf\u00e9 Hoodie for Men, Fleece Lined",
                "product_category": f"Clothing {SEP} Men {SEP} Hoodies",
                "full_description": f"A warm hoodie number {i}.",
                "pricing": "$20.00 - $30.00" if i % 2 else "$25.99",
                "images": ["x.jpg"],
                "small_description": "Kangaroo pocket" if i % 3 == 0 else ["Kangaroo pocket", "Drawstring"],
                "customization_options": {
                    "Color": [{"value": c, "image": None} for c in colors],
                    "Size": [{"value": s, "image": None} for s in sizes],
                },
            }
        )
        if i % 5:
            ins[asin] = {"attributes": ["fleece lined", "machine wash"], "instruction": f"i need a fleece hoodie {i}",
                         "instruction_attributes": ["fleece lined"]}  # fmt: skip
        human_ins[asin] = [
            {"asin": asin, "instruction": f"I want a hoodie {i}-{j} with a kangaroo pocket.",
             "instruction_attributes": ["kangaroo pocket"] if j else [], "instruction_options": ["navy | blue", "m"]}
            for j in range(21)
        ]  # fmt: skip
    items.append({**items[0], "name": "duplicate asin"})
    items.append({**items[1], "asin": "nan"})
    (path / "items_shuffle_tiny.json").write_text(json.dumps(items))
    (path / "items_ins_v2_tiny.json").write_text(json.dumps(ins))
    if human:
        (path / "items_human_ins.json").write_text(json.dumps(human_ins))


def test_loader_reads_webshop_files_with_human_goals(tmp_path) -> None:
    write_webshop_files(tmp_path, human=True)
    catalog = load_webshop(str(tmp_path))
    assert len(catalog.products) == 30 and catalog.by_asin["B0TEST0000"]["name"] != "duplicate asin"
    p0, p1 = catalog.by_asin["B0TEST0000"], catalog.by_asin["B0TEST0001"]
    assert p0["Title"] == "Brand0 Cafe Hoodie for Men, Fleece Lined" and p0["query"] == "men's hoodie"
    assert p0["Attributes"] == ["DUMMY_ATTR"] and p1["Attributes"] == ["fleece lined", "machine wash"]
    assert p0["options"] == {"color": ["black", "navy | blue", "red", "olive green", "white"],
                             "size": ["s", "m", "l", "xl", "xxl"]}  # fmt: skip
    assert p0["pricing"] == [25.99] and p0["Price"] == "$25.99" and p0["price"] == 25.99
    assert p1["Price"] == "$20.00 to $30.00" and 20.0 <= p1["price"] <= 30.0
    assert p0["BulletPoints"] == ["Kangaroo pocket"]
    assert len(catalog.goals) == 30 * 20  # instructions without attributes are skipped, as in WebShop
    g = catalog.goals[0]
    assert g["goal_options"] == ["navy | blue", "m"] and g["attributes"] == ["kangaroo pocket"]
    assert (
        g["instruction_text"].startswith("I want a hoodie") and "pocket, and price lower than" in g["instruction_text"]
    )
    again = load_webshop.__wrapped__(str(tmp_path))
    assert [x["instruction_text"] for x in again.goals] == [x["instruction_text"] for x in catalog.goals]

    env = gym.make(ENV_ID, split="test", data_path=str(tmp_path))
    gagpo_gym.check_text_env(env, n_steps=30)
    won = 0
    for seed in range(20):
        _, info = env.reset(seed=seed)
        while True:
            _, _, terminated, truncated, info = env.step(env.unwrapped.expert_action())
            if terminated or truncated:
                break
        won += info["won"]
    assert won == 20


def test_loader_builds_synthetic_goals_without_human_file(tmp_path) -> None:
    write_webshop_files(tmp_path, human=False)
    catalog = load_webshop(str(tmp_path), num_products=30)
    # products with an instruction: 24 of 30, each with 5 x 5 option combinations
    assert len(catalog.goals) == 24 * 25
    g = catalog.goals[0]
    assert set(g["goal_options"]) == {"color", "size"} and g["attributes"] == ["fleece lined"]
    assert " with color: " in g["instruction_text"] and ", and size: " in g["instruction_text"]
