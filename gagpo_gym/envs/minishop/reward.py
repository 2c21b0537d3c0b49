"""WebShop's purchase reward (``web_agent_site/engine/goal.py: get_reward``), reproduced.

    reward = r_type * (matched attributes + matched options + price ok) / (#attributes + #options + 1)

* ``r_type`` (:func:`get_type_reward`): 1 by default; 0.5 when neither the search query, nor two category-path
  levels, nor more than 20% of the goal name's nouns match; 0.1 when under 10% of the nouns match; 0 when none do.
* A goal attribute matches (:func:`get_attribute_reward`) when its fuzzy token-set ratio with one of the
  product's attributes is above 85, or else when it is a substring of the title, bullet points or description.
* A goal option matches (:func:`get_option_reward`) when its token-set ratio with a chosen option is above 85,
  both first reduced to the first colour word they contain (WebShop's ``normalize_color``).
* The price is ok when the shown price is at most the goal's upper bound.

Choices where WebShop could not be followed to the letter, named:

* Fuzzy ratios use ``rapidfuzz.fuzz.token_set_ratio`` with ``rapidfuzz.utils.default_process`` (lower-case,
  non-alphanumerics to spaces), which equals WebShop's ``thefuzz`` call with its default ``full_process``.
* WebShop takes the nouns of both names with spaCy (tags NOUN/PROPN). spaCy's model is a download, so
  :func:`name_nouns` substitutes the content words of the name's head: the text before the first comma, dash,
  bar, bracket or " for "/" with "/" by " clause (in a product title that is the brand and the product type,
  which is what spaCy's noun tags pick out), minus stop words and tokens with digits.
* A goal without a price bound (``price_upper <= 0``) counts the price as ok (WebShop would add ``None``).
"""

from __future__ import annotations

import re
from typing import Any

from rapidfuzz import fuzz
from rapidfuzz.utils import default_process

FUZZY_THRESHOLD = 85
#: WebShop's colour words, in its order: an option is reduced to the first one it contains.
COLOR_SET = (
    "alabaster", "apricot", "aqua", "ash", "asphalt", "azure", "banana", "beige", "black", "blue", "blush",
    "bordeaux", "bronze", "brown", "burgundy", "camel", "camo", "caramel", "champagne", "charcoal", "cheetah",
    "chestnut", "chocolate", "christmas", "coffee", "cognac", "copper", "coral", "cranberry", "cream", "crystal",
    "dark", "denim", "eggplant", "elephant", "espresso", "fuchsia", "gold", "granite", "grape", "graphite",
    "grass", "gray", "green", "grey", "heather", "indigo", "ivory", "ivy", "khaki", "lavender", "lemon",
    "leopard", "light", "lilac", "lime", "magenta", "maroon", "mauve", "merlot", "midnight", "mint", "mocha",
    "multicolor", "mushroom", "mustard", "natural", "navy", "nude", "olive", "orange", "peach", "pewter", "pink",
    "plum", "purple", "rainbow", "red", "rose", "royal", "rust", "sand", "sapphire", "seashell", "silver",
    "skull", "slate", "steel", "stone", "stonewash", "sunflower", "tan", "taupe", "teal", "tiger", "turquoise",
    "violet", "walnut", "wheat", "white", "wine", "yellow",
)  # fmt: skip
_STOP_WORDS = frozenset({"a", "an", "the", "and", "or", "of", "for", "with", "in", "on", "to", "by", "at", "from"})
_HEAD_SPLIT = re.compile(r",|;|\||\(|\[| - | \u2013 | for | with | by ")


def fuzzy_ratio(a: str, b: str) -> float:
    """Token-set ratio in [0, 100] after WebShop's (thefuzz's) default preprocessing."""
    return fuzz.token_set_ratio(a, b, processor=default_process)


def normalize_color(option: str) -> str:
    """The first WebShop colour word contained in ``option``, else ``option`` itself."""
    for color in COLOR_SET:
        if color in option:
            return color
    return option


def name_nouns(name: str) -> list[str]:
    """Stand-in for spaCy's NOUN/PROPN tokens of a product name (see the module docstring)."""
    head = _HEAD_SPLIT.split(f" {name.lower()} ", maxsplit=1)[0]
    words = re.findall(r"[a-z0-9][a-z0-9'.-]*", head)
    return [w for w in words if w not in _STOP_WORDS and not any(ch.isdigit() for ch in w)]


def get_type_reward(product: dict, goal: dict) -> dict[str, Any]:
    """Does the bought product have the goal's type? (query, category path, name nouns)."""
    query_match = product["query"] == goal["query"]
    product_levels = {x.strip() for x in product["product_category"].split("\u203a")}
    goal_levels = {x.strip() for x in goal["product_category"].split("\u203a")}
    category_match = len(product_levels & goal_levels) >= 2
    bought, desired = name_nouns(product["name"]), name_nouns(goal["name"])
    title_score = 0.2 if not desired else len(set(bought) & set(desired)) / len(desired)
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {"r_type": r_type, "query_match": query_match, "category_match": category_match,
            "title_score": title_score}  # fmt: skip


def get_attribute_reward(product: dict, goal: dict) -> tuple[float | None, int]:
    """(share, number) of goal attributes found among the product's attributes, title, bullets, description."""
    title = product["Title"].lower()
    bullets = " ".join(product["BulletPoints"]).lower()
    description = product["Description"].lower()
    matches = 0
    for g_attr in goal["attributes"]:
        if any(fuzzy_ratio(p_attr, g_attr) > FUZZY_THRESHOLD for p_attr in product["Attributes"]) or (
            g_attr in title or g_attr in bullets or g_attr in description
        ):
            matches += 1
    n = len(goal["attributes"])
    return (matches / n if n else None), matches


def goal_option_values(goal: dict) -> list[str]:
    """Goal options as a list of values (synthetic goals store a dict, human goals a list)."""
    options = goal["goal_options"]
    return list(options.values()) if isinstance(options, dict) else list(options)


def get_option_reward(chosen: list[str], goal_options: list[str]) -> tuple[float | None, int]:
    """(share, number) of goal options matched by a chosen option after colour normalisation."""
    chosen = [normalize_color(o) for o in chosen]
    wanted = [normalize_color(o) for o in goal_options]
    matches = sum(any(fuzzy_ratio(c, g) > FUZZY_THRESHOLD for c in chosen) for g in wanted)
    return (matches / len(wanted) if wanted else None), matches


def get_reward(
    product: dict, goal: dict, price: float, options: dict[str, str], verbose: bool = False
) -> float | tuple[float, dict[str, Any]]:
    """WebShop's reward in [0, 1] for buying ``product`` at ``price`` with the chosen ``options``."""
    type_info = get_type_reward(product, goal)
    price_ok = price <= goal["price_upper"] if goal["price_upper"] > 0 else True
    r_attr, n_attr = get_attribute_reward(product, goal)
    goal_options = goal_option_values(goal)
    r_option, n_option = get_option_reward(list(options.values()), goal_options)
    total = (n_attr + n_option + int(price_ok)) / (len(goal["attributes"]) + len(goal_options) + 1)
    total *= type_info["r_type"]
    if not verbose:
        return total
    return total, {**type_info, "r_att": r_attr, "r_option": r_option, "r_price": price_ok,
                   "w_att": len(goal["attributes"]) / (len(goal["attributes"]) + len(goal_options) + 1)}  # fmt: skip
