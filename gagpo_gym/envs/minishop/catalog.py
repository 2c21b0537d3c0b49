"""Products and goals in WebShop's schemas: a generated catalog, and a loader for the real WebShop files.

WebShop (Yao et al., 2022) ships three files: ``items_shuffle*.json`` (a list of scraped products),
``items_ins_v2*.json`` (``asin -> {"attributes", "instruction", "instruction_attributes"}``) and
``items_human_ins.json`` (``asin -> [{"instruction", "instruction_attributes", "instruction_options"}, ...]``).
Its ``load_products`` turns them into processed products (``Title``, ``Description``, ``BulletPoints``,
``Attributes``, ``options``, ``pricing``, ``Price``) and its goal builders into goals (``asin``, ``category``,
``query``, ``name``, ``product_category``, ``instruction_text``, ``attributes``, ``goal_options``,
``price_upper``). :func:`process_products` and the goal builders here do the same.

The generated catalog is written in the raw file schemas first and goes through the same processing, so the env
cannot tell it from real data. Every random choice comes from :class:`Draws` (NumPy's PCG64 stream read in a
fixed order), so the catalog and the goal order are identical on every machine.
"""

from __future__ import annotations

import glob
import itertools
import json
import os
import random
import re
import time
import unicodedata
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from gagpo_gym.envs.minishop.taxonomy import CATEGORIES

#: WebShop's category separator in ``product_category`` (a single right-pointing angle quotation mark).
CATEGORY_SEP = "\u203a"
#: WebShop's price grid for goal upper bounds.
PRICE_RANGE = [10.0 * i for i in range(1, 100)]
#: Goal indices ``[0, TEST_GOALS)`` are the test split, as in WebShop; the rest is the train split.
TEST_GOALS = 500
NO_PRICE_LIMIT = 1_000_000.0
CATALOG_SEED = 20220715
GOALS_PER_PRODUCT = 2
#: WebShop shuffles its goals with ``random.seed(233)``; the loader does the same for real data.
WEBSHOP_GOAL_SHUFFLE_SEED = 233


_SYLLABLES = ("lu", "mo", "ra", "ve", "ta", "ki", "no", "sa", "be", "do", "ri", "za", "fe", "lo", "mi", "pa",
              "cor", "vin", "tel", "dar", "max", "zen", "qui", "bel")  # fmt: skip
_GOAL_OPENERS = ("i need", "i am looking for", "i want to buy", "find me", "i'm searching for", "i would like")
_BULLET_TEMPLATES = (
    "{F}: made with {f} so it works the way you expect, day after day.",
    "{F} - a {noun} built around {f} for everyday use.",
    "{F}: customers choose this {noun} for its {f}.",
    "{F}: {f} tested by our quality team before shipping.",
)
_CLOSINGS = ("Backed by a 30 day return policy.", "Ships in recyclable packaging.", "Designed and tested in house.")
_REVIEW_TEMPLATES = (
    (5, "Exactly as described. The {f} really shows."),
    (4, "Good {noun} for the price, would buy again."),
    (3, "It is fine, though I expected more from the {f}."),
    (5, "My second {noun} from {brand}; still happy with it."),
    (2, "Arrived late and the {f} is not what I hoped."),
)


class Draws:
    """Uniform draws from ``numpy.random.Generator(PCG64(seed))``, fetched in blocks.

    One C call per 4096 numbers instead of one per draw keeps building a few thousand products fast; every
    draw is a float in [0, 1) turned into an index in plain Python, so the stream is the same on every machine.
    """

    def __init__(self, seed: int | list[int]) -> None:
        self._rng = np.random.Generator(np.random.PCG64(seed))
        self._block: list[float] = []
        self._next = 0

    def random(self) -> float:
        if self._next == len(self._block):
            self._block, self._next = self._rng.random(4096).tolist(), 0
        self._next += 1
        return self._block[self._next - 1]

    def integers(self, low: int, high: int) -> int:
        """An int in ``[low, high)``."""
        return low + int(self.random() * (high - low))

    def uniform(self, low: float, high: float) -> float:
        return low + (high - low) * self.random()

    def choice(self, seq: tuple | list) -> Any:
        return seq[self.integers(0, len(seq))]

    def permutation(self, n: int) -> list[int]:
        order = list(range(n))
        for i in range(n - 1):
            j = self.integers(i, n)
            order[i], order[j] = order[j], order[i]
        return order

    def sample(self, seq: tuple | list, k: int) -> list:
        """``k`` distinct elements of ``seq``, kept in ``seq`` order."""
        return [seq[i] for i in sorted(self.permutation(len(seq))[: min(k, len(seq))])]


def to_ascii(text: str) -> str:
    """Plain printable ASCII (accents folded, other characters dropped), single-spaced."""
    text = str(text)
    if text.isascii() and text.isprintable():
        return " ".join(text.split())
    folded = unicodedata.normalize("NFKD", str(text)).encode("ascii", "ignore").decode("ascii")
    return " ".join("".join(ch if ch.isprintable() else " " for ch in folded).split())


def price_upper_bound(price: float, draws: Draws) -> tuple[float, str]:
    """WebShop's goal price: the larger of two draws among the first four grid prices above ``price``."""
    grid = [p for p in PRICE_RANGE if p > price][:4]
    if len(grid) < 2:
        return NO_PRICE_LIMIT, ""
    upper = grid[max(draws.permutation(len(grid))[:2])]
    return upper, f", and price lower than {upper:.2f} dollars"


# ----- the generated catalog, written in WebShop's raw file schemas --------------------------------------
def generate_webshop_files(n_products: int, seed: int = CATALOG_SEED) -> tuple[list[dict], dict[str, dict]]:
    """Raw ``items_shuffle`` records and the ``items_ins_v2`` attribute map for ``n_products`` products.

    Products cycle through the 50 product types. A product's features are three or four of its type's
    phrases and two of its category's; all of them are in its bullet points and description, two or three in
    its title, and the first three or four form its ``attributes`` list, so the others can only be matched
    through the title/bullets/description, as in WebShop.
    """
    draws = Draws(seed)
    brands = sorted({"".join(draws.sample(_SYLLABLES, 2)).capitalize() for _ in range(400)})
    kinds = [(cat, kind) for cat in CATEGORIES for kind in cat.types]
    items: list[dict] = []
    ins: dict[str, dict] = {}
    asins: set[str] = set()
    alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    for i in range(n_products):
        cat, kind = kinds[i % len(kinds)]
        asin = ""
        while not asin or asin in asins:
            asin = "B0" + "".join(draws.choice(alphabet) for _ in range(8))
        asins.add(asin)
        brand = draws.choice(brands)
        features = draws.sample(kind.features, draws.integers(3, 5)) + draws.sample(cat.common, 2)
        features = [features[j] for j in draws.permutation(len(features))]
        in_title = features[: draws.integers(2, 4)]
        descriptor = draws.choice(cat.descriptors) + " " if draws.random() < 0.5 else ""
        name = f"{brand} {descriptor}{kind.noun}, " + ", ".join(f.title() for f in in_title)
        options = {
            opt: draws.sample(values, draws.integers(2, min(len(values), 5) + 1))
            for opt, values in kind.options.items()
        }
        price = round(draws.uniform(*kind.price)) - 0.01
        pricing = f"${price:.2f} - ${price * 1.3:.2f}" if draws.random() < 0.1 else f"${price:.2f}"
        noun = kind.noun.lower()
        bullets = [draws.choice(_BULLET_TEMPLATES).format(F=f.upper(), f=f, noun=noun) for f in features]
        description = (
            f"{brand} {kind.noun} from our {cat.root.lower()} range. It offers {', '.join(features[:-1])} "
            f"and {features[-1]}. {draws.choice(_CLOSINGS)}"
        )
        reviews = []
        for _ in range(draws.integers(1, 4)):
            score, body = draws.choice(_REVIEW_TEMPLATES)
            reviews.append({"score": score, "body": body.format(f=draws.choice(features), noun=noun, brand=brand)})
        items.append(
            {
                "asin": asin,
                "category": cat.name,
                "query": kind.query,
                "name": name,
                "product_category": f" {CATEGORY_SEP} ".join([cat.root, *kind.path]),
                "full_description": description,
                "pricing": pricing,
                "list_price": "",
                "images": [""],
                "average_rating": round(sum(r["score"] for r in reviews) / len(reviews), 1),
                "total_reviews": len(reviews),
                "small_description": bullets,
                "brand": brand,
                "customization_options": {
                    opt: [{"value": v, "image": None} for v in values] for opt, values in options.items()
                },
                "reviews": reviews,
            }
        )
        ins[asin] = {"attributes": features[: draws.integers(3, 5)], "features": features}
    return items, ins


def generated_goals(products: list[dict], ins: dict[str, dict], seed: int = CATALOG_SEED) -> list[dict]:
    """``GOALS_PER_PRODUCT`` goals per product in WebShop's synthetic-goal schema, shuffled by ``seed``.

    A goal asks for two or three of the product's features by name, one value of each of its options and a
    price bound (WebShop's rule); goals with the same instruction text are kept once.
    """
    draws = Draws([seed, 1])
    goals: list[dict] = []
    seen: set[str] = set()
    for product in products:
        features = ins[product["asin"]]["features"]
        for _ in range(GOALS_PER_PRODUCT):
            attributes = draws.sample(features, draws.integers(2, 4))
            goal_options = {name: draws.choice(values) for name, values in product["options"].items()}
            upper, price_text = price_upper_bound(product["price"], draws)
            attr_text = " and ".join([", ".join(attributes[:-1]), attributes[-1]] if len(attributes) > 1
                                     else attributes)  # fmt: skip
            query = product["query"]
            plural = query.endswith("s") and not query.endswith("ss")
            article = "" if plural else ("an " if attr_text[0] in "aeiou" else "a ")
            option_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
            instruction = (
                f"{draws.choice(_GOAL_OPENERS)} {article}{attr_text} {query}"
                + (f" with {option_text}" if option_text else "")
                + price_text
            )
            if instruction not in seen:
                seen.add(instruction)
                goals.append(_goal(product, instruction, attributes, goal_options, upper))
    return [goals[i] for i in draws.permutation(len(goals))]


def _goal(product: dict, instruction: str, attributes: list[str], options: Any, upper: float) -> dict:
    return {
        "asin": product["asin"],
        "category": product["category"],
        "query": product["query"],
        "name": product["name"],
        "product_category": product["product_category"],
        "instruction_text": instruction,
        "attributes": list(attributes),
        "price_upper": float(upper),
        "goal_options": options,
        "weight": 1,
    }


# ----- WebShop's processing (load_products / get_human_goals / get_synthetic_goals) ---------------------
def _parse_pricing(pricing: Any) -> list[float]:
    if not pricing or not isinstance(pricing, str):
        return [100.0]
    values = []
    for part in pricing.split("$")[1:]:
        digits = re.sub(r"[^\d.]", "", part)
        try:
            values.append(float(digits))
        except ValueError:
            continue
    return values[:2] or [100.0]


def process_products(
    items: list[dict],
    ins: dict[str, dict],
    human_ins: dict[str, list] | None = None,
    price_seed: int = CATALOG_SEED,
) -> list[dict]:
    """WebShop's ``load_products``: keep the first record per ASIN and derive the page fields.

    Each product's shown price is drawn once, uniformly inside its pricing range (WebShop's
    ``generate_product_prices``), from a fixed-seed generator, and rounded to cents. Text is folded to ASCII.
    """
    draws = Draws([price_seed, 2])
    seen: set[str] = set()
    products: list[dict] = []
    for raw in items:
        asin = str(raw.get("asin", ""))
        if not asin or asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        pricing = _parse_pricing(raw.get("pricing"))
        if len(pricing) == 1:
            price, tag = pricing[0], f"${pricing[0]:.2f}"
        else:
            price, tag = round(draws.uniform(*pricing), 2), f"${pricing[0]:.2f} to ${pricing[1]:.2f}"
        options: dict[str, list[str]] = {}
        for opt_name, contents in (raw.get("customization_options") or {}).items():
            if not contents:
                continue
            values = [to_ascii(c["value"]).replace("/", " | ").lower() for c in contents if to_ascii(c["value"])]
            if values:
                options[to_ascii(opt_name).lower()] = list(dict.fromkeys(values))
        bullets = raw.get("small_description") or []
        bullets = bullets if isinstance(bullets, list) else [bullets]
        reviews = [
            {
                "score": r.get("score", r.get("stars", "")),
                "body": to_ascii(r.get("body", r.get("review", ""))),
            }
            for r in raw.get("reviews", [])
        ]
        product = {
            "asin": asin,
            "category": raw.get("category", ""),
            "query": str(raw.get("query", "")).lower().strip(),
            "name": to_ascii(raw.get("name", "")),
            "product_category": raw.get("product_category", ""),
            "Title": to_ascii(raw.get("name", "")),
            "Description": to_ascii(raw.get("full_description", "")),
            "BulletPoints": [to_ascii(b) for b in bullets if to_ascii(b)],
            "Reviews": reviews,
            "Rating": raw.get("average_rating") or "N.A.",
            "pricing": pricing,
            "Price": tag,
            "price": price,
            "options": options,
            "Attributes": list(ins.get(asin, {}).get("attributes") or ["DUMMY_ATTR"]),
        }
        if human_ins is not None and asin in human_ins:
            product["instructions"] = human_ins[asin]
        elif asin in ins and ins[asin].get("instruction"):
            product["instruction_text"] = ins[asin]["instruction"]
            product["instruction_attributes"] = ins[asin].get("instruction_attributes") or []
        products.append(product)
    return products


def human_goals(products: list[dict], seed: int = CATALOG_SEED) -> list[dict]:
    """WebShop's ``get_human_goals``: one goal per human instruction with at least one attribute."""
    draws = Draws([seed, 3])
    goals = []
    for product in products:
        for ins in product.get("instructions", []):
            attributes = ins.get("instruction_attributes") or []
            if not attributes:
                continue
            upper, price_text = price_upper_bound(product["price"], draws)
            text = to_ascii(ins["instruction"]).strip(".") + price_text
            goals.append(_goal(product, text, attributes, list(ins.get("instruction_options") or []), upper))
    return goals


def synthetic_goals(products: list[dict], seed: int = CATALOG_SEED) -> list[dict]:
    """WebShop's ``get_synthetic_goals``: one goal per option combination of each instructed product."""
    draws = Draws([seed, 4])
    goals = []
    for product in products:
        if not product.get("instruction_text") or not product.get("instruction_attributes"):
            continue
        upper, price_text = price_upper_bound(product["price"], draws)
        names = sorted(product["options"])
        for combination in itertools.product(*(product["options"][n] for n in names)):
            goal_options = dict(zip(names, combination))
            option_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
            text = to_ascii(product["instruction_text"]) + (f" with {option_text}" if option_text else "")
            goals.append(_goal(product, text + price_text, product["instruction_attributes"], goal_options, upper))
    return goals


# ----- catalogs ----------------------------------------------------------------------------------------
@dataclass
class Catalog:
    """Processed products, their index by ASIN and the goals in fixed order (test = the first ``TEST_GOALS``)."""

    products: list[dict]
    goals: list[dict]
    source: str
    build_seconds: float = 0.0
    by_asin: dict[str, dict] = field(init=False)

    def __post_init__(self) -> None:
        self.by_asin = {p["asin"]: p for p in self.products}
        if len(self.goals) <= TEST_GOALS:
            raise ValueError(
                f"{self.source}: {len(self.goals)} goals; need more than {TEST_GOALS} so that the test split "
                f"(the first {TEST_GOALS}) and the train split are both non-empty"
            )

    def split(self, name: str) -> list[dict]:
        """Goals of the ``"test"`` (indices 0..499, as in WebShop) or ``"train"`` (500..) split."""
        if name == "test":
            return self.goals[:TEST_GOALS]
        if name == "train":
            return self.goals[TEST_GOALS:]
        raise ValueError(f"split must be 'train' or 'test', got {name!r}")


@lru_cache(maxsize=4)
def generated_catalog(n_products: int, seed: int = CATALOG_SEED) -> Catalog:
    """The generated catalog, built once per process (memory only, never written to disk)."""
    start = time.perf_counter()
    items, ins = generate_webshop_files(n_products, seed)
    products = process_products(items, ins, price_seed=seed)
    goals = generated_goals(products, ins, seed)
    return Catalog(products, goals, f"generated(n_products={n_products}, seed={seed})", time.perf_counter() - start)


def _find_file(data_path: str, pattern: str, preferred: str) -> str | None:
    exact = os.path.join(data_path, preferred)
    if os.path.isfile(exact):
        return exact
    matches = sorted(glob.glob(os.path.join(data_path, pattern)))
    return matches[0] if matches else None


@lru_cache(maxsize=2)
def load_webshop(data_path: str, num_products: int | None = None) -> Catalog:
    """A catalog from the real WebShop files in ``data_path`` (the first ``num_products`` products).

    Uses ``items_human_ins.json`` goals when that file is present (WebShop's default), synthetic goals from
    ``items_ins_v2*.json`` otherwise, and shuffles them with ``random.Random(233)`` as WebShop does.
    """
    start = time.perf_counter()
    if not os.path.isdir(data_path):
        raise ValueError(f"data_path {data_path!r} is not a directory")
    items_file = _find_file(data_path, "items_shuffle*.json", "items_shuffle.json")
    ins_file = _find_file(data_path, "items_ins_v2*.json", "items_ins_v2.json")
    if items_file is None or ins_file is None:
        raise ValueError(f"data_path {data_path!r} needs items_shuffle*.json and items_ins_v2*.json")
    with open(items_file, encoding="utf-8") as f:
        items = json.load(f)
    with open(ins_file, encoding="utf-8") as f:
        ins = json.load(f)
    human_file = os.path.join(data_path, "items_human_ins.json")
    human_ins = None
    if os.path.isfile(human_file):
        with open(human_file, encoding="utf-8") as f:
            human_ins = json.load(f)
    if num_products is not None:
        items = items[:num_products]
    products = process_products(items, ins, human_ins)
    goals = human_goals(products) if human_ins is not None else synthetic_goals(products)
    random.Random(WEBSHOP_GOAL_SHUFFLE_SEED).shuffle(goals)
    return Catalog(products, goals, f"webshop({data_path}, num_products={num_products})", time.perf_counter() - start)
