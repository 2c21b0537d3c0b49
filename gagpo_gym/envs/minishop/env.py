"""MiniShop: WebShop's text protocol and reward over a generated (or the real) product catalog.

Actions are WebShop's: ``search[query]`` on the search page (any non-empty query is valid; the admissible list
offers a few goal-derived queries so that a policy choosing from a list can search too) and ``click[value]``
for the page's buttons, product ids and option values, case-insensitive. Anything else is invalid and changes
nothing. ``Buy Now`` ends the episode with WebShop's reward in [0, 1] (also ``info["score"]``); ``won`` means
reward 1, the paper's success. ``reset(seed=s)`` takes goal ``s mod n`` of the split (WebShop's session index),
so seeds 0..499 on the test split are WebShop's test protocol; ``options={"goal_index": i}`` picks one directly.
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Any

from gagpo_gym.core import TextEnv, normalize_command
from gagpo_gym.envs.minishop.catalog import Catalog, generated_catalog, load_webshop
from gagpo_gym.envs.minishop.engine import BACK, BUY, NEXT, PREV, RESULTS_PER_PAGE, PageState, Shop, tokenize
from gagpo_gym.envs.minishop.reward import get_option_reward, get_reward, goal_option_values

DEFAULT_CATALOG_SIZE = 3000
MIN_CATALOG_SIZE = 300
SPLITS = ("train", "test")


@lru_cache(maxsize=4)
def _shop(catalog_size: int | None, data_path: str | None) -> Shop:
    """One catalog and search index per process and configuration."""
    if data_path is not None:
        return Shop(load_webshop(data_path, catalog_size))
    return Shop(generated_catalog(catalog_size))


def search_candidates(goal: dict) -> list[str]:
    """A few search queries derived from the goal alone: its key phrase, attributes + type, the type."""
    query, attributes = goal["query"], " ".join(goal["attributes"])
    candidates = [
        f"{attributes} {query} {' '.join(goal_option_values(goal))}",
        f"{attributes} {query}",
        query,
    ]
    cleaned = (" ".join(tokenize(c)) for c in candidates)
    return [f"search[{c}]" for c in dict.fromkeys(c for c in cleaned if c)] or ["search[shop]"]  # never empty


class MiniShopEnv(TextEnv):
    """Buy what the instruction asks for in a WebShop-protocol shop (``gagpo_gym/MiniShop-v0``)."""

    #: The kinds of :meth:`expert_action`: one, it knows the goal and the catalogue.
    EXPERTS = ("oracle",)

    def __init__(
        self,
        split: str = "train",
        catalog_size: int | None = None,
        data_path: str | None = None,
        render_mode: str | None = None,
    ) -> None:
        """``catalog_size``: products to generate (default 3000), or with ``data_path`` (a folder with the
        real WebShop files) how many of its products to load (default all)."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if data_path is not None and not isinstance(data_path, str):
            raise ValueError(f"data_path must be a folder path (str), got {data_path!r}")
        low = 1 if data_path is not None else MIN_CATALOG_SIZE
        if catalog_size is not None and (
            not isinstance(catalog_size, int) or isinstance(catalog_size, bool) or catalog_size < low
        ):
            raise ValueError(f"catalog_size must be None or an int >= {low}, got {catalog_size!r}")
        super().__init__(render_mode=render_mode)
        self.split = split
        if data_path is None:
            self.shop = _shop(catalog_size or DEFAULT_CATALOG_SIZE, None)
        else:
            self.shop = _shop(catalog_size, os.path.abspath(data_path))
        self.goals = self.catalog.split(split)
        self.goal: dict = self.goals[0]
        self.goal_index = 0
        self.state = PageState()
        self.score = 0.0
        self._plan: tuple[str, str] | None = None

    @property
    def catalog(self) -> Catalog:
        return self.shop.catalog

    # ----- tasks -------------------------------------------------------------------------------------
    def _new_task(self, seed: int | None, options: dict[str, Any]) -> str:
        n = len(self.goals)
        if "goal_index" in options:
            index = options["goal_index"]
            if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < n:
                raise ValueError(f"options['goal_index'] must be an int in [0, {n}), got {index!r}")
        elif seed is not None:
            index = seed % n
        else:
            index = int(self.np_random.integers(n))
        self.goal_index = index
        self.goal = self.goals[index]
        self.task = self.goal["instruction_text"]
        self.task_id = f"minishop-{self.split}-{index}-{self.goal['asin']}"
        self.task_type = self.goal["category"] or None
        self.state = PageState()
        self.score = 0.0
        self._plan = None
        return self._observe()

    # ----- dynamics ----------------------------------------------------------------------------------
    def canonical_action(self, action: Any) -> str | None:
        command = normalize_command(action)
        if command is None or not command.endswith("]"):
            return None
        if command.startswith("search["):
            query = " ".join(command[len("search[") : -1].split())
            return f"search[{query}]" if self.state.page == "search" and query else None
        if command.startswith("click["):
            value = command[len("click[") : -1].strip()
            if self.state.page == "done":
                return "click[back to search]" if value == BACK else None
            return f"click[{value}]" if value in self.shop.clickables(self.state) else None
        return None

    def _execute(self, command: str) -> tuple[str, float, bool]:
        if self.state.page == "done":  # the purchase is final: the done page stays
            return self._observe(), 0.0, True
        if command.startswith("search["):
            self.state = PageState(page="results", query=command[len("search[") : -1])
            return self._observe(), 0.0, False
        self.state = self.shop.click(self.state, command[len("click[") : -1])
        if self.state.page != "done":
            return self._observe(), 0.0, False
        product = self.catalog.by_asin[self.state.asin]
        self.score = float(get_reward(product, self.goal, product["price"], self.state.chosen()))
        self.won = self.score == 1.0
        return self._observe(), self.score, True

    def _observe(self) -> str:
        return self.shop.render(self.state, self.task, self.score)

    def admissible_actions(self) -> list[str]:
        if self.state.page == "search":
            return search_candidates(self.goal)
        if self.state.page == "done":
            return [f"click[{BACK}]"]
        return [f"click[{v}]" for v in self.shop.clickables(self.state)]

    def state_string(self) -> str:
        return f"minishop|{self.task_id}|{self.state.key()}"

    def _info(self, **extra: Any) -> dict[str, Any]:
        info = super()._info(**extra)
        if self.state.page == "done":
            info["score"] = self.score
        return info

    # ----- the oracle --------------------------------------------------------------------------------
    def expert_action(self, kind: str | None = None) -> str:
        """Search with the candidate that ranks the goal's product best, open it, choose options, buy.

        When no candidate query retrieves the goal's product, the plan buys the retrieved product with the
        highest reward instead. From any other page the expert walks back towards the plan.
        """
        self._expert_kind(kind)
        query, target = self._expert_plan()
        state = self.state
        if state.page == "search":
            return query
        if state.page == "done":
            return f"click[{BACK}]"
        if state.page == "sub":
            return f"click[{PREV}]"
        if state.page == "item":
            if state.asin != target:
                return f"click[{PREV}]"
            chosen = state.chosen()
            for name, value in self._best_options(target).items():
                if chosen.get(name) != value:
                    return f"click[{value}]"
            return f"click[{BUY}]"
        results = self.shop.search(state.query)
        if target not in results:
            return f"click[{BACK}]"
        page = results.index(target) // RESULTS_PER_PAGE + 1
        if page > state.page_no:
            return f"click[{NEXT}]"
        if page < state.page_no:
            return f"click[{PREV}]"
        return f"click[{target.lower()}]"

    def _expert_plan(self) -> tuple[str, str]:
        if self._plan is None:
            candidates = search_candidates(self.goal)
            ranked = [(self.shop.search(c[len("search[") : -1]), c) for c in candidates]
            hits = [(r.index(self.goal["asin"]), c) for r, c in ranked if self.goal["asin"] in r]
            if hits:
                self._plan = (min(hits)[1], self.goal["asin"])
            else:
                best = max(
                    ((self._best_reward(asin), -i, c, asin) for r, c in ranked for i, asin in enumerate(r)),
                    default=(0.0, 0, candidates[0], self.goal["asin"]),
                )
                self._plan = (best[2], best[3])
        return self._plan

    def _best_options(self, asin: str) -> dict[str, str]:
        """Per option of the product, the value matching the most goal options (an exact value first).

        Only values whose click sets that option are considered (in real data a value can be listed under two
        options, or read like a button), so following this never loops.
        """
        wanted = goal_option_values(self.goal)
        item = PageState(page="item", asin=asin)
        best = {}
        for name, values in self.catalog.by_asin[asin]["options"].items():
            scored = [
                (get_option_reward([v], wanted)[1], v in wanted, -i, v)
                for i, v in enumerate(values)
                if v in self.shop.clickables(item) and self.shop.click(item, v).chosen() == {name: v}
            ]
            top = max(scored, default=(0, False, 0, ""))
            if top[0] > 0:
                best[name] = top[3]
        return best

    def _best_reward(self, asin: str) -> float:
        product = self.catalog.by_asin[asin]
        return float(get_reward(product, self.goal, product["price"], self._best_options(asin)))
