"""The shop's pages: BM25 search over the catalog, page states, clicks and WebShop's text rendering.

Pages are WebShop's: ``search`` -> ``results`` (10 per page, at most 50 results, ``Next >`` / ``< Prev``) ->
``item`` (options, ``Description`` / ``Features`` / ``Reviews`` / ``Attributes`` sub-pages, ``Buy Now``) ->
``done``. ``Back to Search`` works everywhere before ``done``. A :class:`PageState` is the whole navigation
state, so transitions are pure functions and the env's state key is the page state, not the text.

Every page starts with the instruction, as in WebShop's text mode. One addition: the item page lists the chosen
options (``Selected: size: large``), which WebShop's text mode leaves implicit, so that the text shows the state.
The search index covers each product's title, description, bullet points and option values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np
from rank_bm25 import BM25Okapi

from gagpo_gym.envs.minishop.catalog import Catalog

SEP = " [SEP] "
RESULTS_PER_PAGE = 10
MAX_RESULTS = 50
SUB_PAGES = ("description", "features", "reviews", "attributes")
BACK, PREV, NEXT, BUY = "back to search", "< prev", "next >", "buy now"
_STOP_WORDS = frozenset({
    "a", "an", "the", "and", "or", "of", "for", "with", "in", "on", "to", "by", "at", "from", "i", "m",
    "me", "my", "need", "want", "looking", "buy", "find", "am", "is", "it", "would", "like", "searching", "get",
    "some",
})  # fmt: skip


def tokenize(text: str) -> list[str]:
    """Lower-case alphanumeric tokens without stop words: the terms both documents and queries are cut into."""
    return [t for t in re.findall(r"[a-z0-9]+", text.lower()) if t not in _STOP_WORDS]


@dataclass(frozen=True)
class PageState:
    """Where the shopper is: page kind, the search that led here, the item, its chosen options, a sub-page."""

    page: str = "search"  # search | results | item | sub | done
    query: str = ""
    page_no: int = 1
    asin: str = ""
    options: tuple[tuple[str, str], ...] = ()  # (option name, value), sorted by name
    sub: str = ""

    def key(self) -> str:
        opts = ";".join(f"{k}={v}" for k, v in self.options)
        return f"{self.page}|q={self.query}|p={self.page_no}|item={self.asin}|opts={opts}|sub={self.sub}"

    def chosen(self) -> dict[str, str]:
        return dict(self.options)


class Shop:
    """A catalog with its BM25 index; knows each page's clickables, what a click does, and how pages read."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.asins = [p["asin"] for p in catalog.products]
        docs = [
            tokenize(
                " ".join(
                    [p["Title"], p["Description"], *p["BulletPoints"], *(v for vs in p["options"].values() for v in vs)]
                )
            )
            for p in catalog.products
        ]
        self._bm25 = BM25Okapi(docs)
        self.search = lru_cache(maxsize=4096)(self._search)

    def _search(self, query: str) -> tuple[str, ...]:
        """ASINs of the (at most 50) best BM25 matches; documents sharing no term with the query are left out."""
        terms = tokenize(query)
        if not terms:
            return ()
        scores = self._bm25.get_scores(terms)
        order = np.argsort(-scores, kind="stable")[:MAX_RESULTS]
        return tuple(self.asins[i] for i in order if scores[i] > 0)

    # ----- navigation --------------------------------------------------------------------------------
    def page_results(self, state: PageState) -> tuple[str, ...]:
        start = (state.page_no - 1) * RESULTS_PER_PAGE
        return self.search(state.query)[start : start + RESULTS_PER_PAGE]

    def n_pages(self, query: str) -> int:
        return max(1, -(-len(self.search(query)) // RESULTS_PER_PAGE))

    def clickables(self, state: PageState) -> list[str]:
        """The values ``click[...]`` accepts on this page, lower-case, in page order."""
        if state.page == "results":
            buttons = [BACK]
            if state.page_no > 1:
                buttons.append(PREV)
            if state.page_no < self.n_pages(state.query):
                buttons.append(NEXT)
            return buttons + [a.lower() for a in self.page_results(state)]
        if state.page == "item":
            product = self.catalog.by_asin[state.asin]
            values = list(dict.fromkeys(v for vs in product["options"].values() for v in vs))
            reserved = {BACK, PREV, BUY, *SUB_PAGES}
            return [BACK, PREV, *(v for v in values if v not in reserved), *SUB_PAGES, BUY]
        if state.page == "sub":
            return [BACK, PREV]
        return []

    def click(self, state: PageState, value: str) -> PageState:
        """The page after clicking ``value`` (one of :meth:`clickables`; ``buy now`` leads to ``done``)."""
        if value == BACK:
            return PageState()
        if state.page == "results":
            if value == NEXT:
                return replace(state, page_no=state.page_no + 1)
            if value == PREV:
                return replace(state, page_no=state.page_no - 1)
            return replace(state, page="item", asin=value.upper(), options=())
        if state.page == "item":
            if value == PREV:
                return replace(state, page="results", asin="", options=())
            if value in SUB_PAGES:
                return replace(state, page="sub", sub=value)
            if value == BUY:
                return replace(state, page="done")
            product = self.catalog.by_asin[state.asin]
            name = next(n for n, vs in product["options"].items() if value in vs)
            chosen = {**state.chosen(), name: value}
            return replace(state, options=tuple(sorted(chosen.items())))
        if state.page == "sub" and value == PREV:
            return replace(state, page="item", sub="")
        raise ValueError(f"{value!r} is not clickable on the {state.page} page")

    # ----- text --------------------------------------------------------------------------------------
    def render(self, state: PageState, instruction: str, score: float | None = None) -> str:
        """WebShop's text observation: the page's visible strings joined with `` [SEP] ``."""
        head = ["Instruction:", instruction]
        if state.page == "search":
            return SEP.join(["WebShop", *head, "Search"])
        if state.page == "done":
            product = self.catalog.by_asin[state.asin]
            chosen = ", ".join(f"{k}: {v}" for k, v in state.options) or "none"
            return SEP.join(
                ["Thank you for shopping with us!", "Purchased", state.asin, product["Title"],
                 f"Options: {chosen}", "Your score (min 0.0, max 1.0)", f"{score:.4f}"]
            )  # fmt: skip
        parts = [*head, "Back to Search"]
        if state.page == "results":
            total = len(self.search(state.query))
            parts.append(f"Page {state.page_no} (Total results: {total})")
            if state.page_no > 1:
                parts.append("< Prev")
            if state.page_no < self.n_pages(state.query):
                parts.append("Next >")
            for asin in self.page_results(state):
                product = self.catalog.by_asin[asin]
                parts += [asin, product["Title"], product["Price"]]
            return SEP.join(parts)
        product = self.catalog.by_asin[state.asin]
        parts.append("< Prev")
        if state.page == "sub":
            return SEP.join(parts + self._sub_page(product, state.sub))
        for name, values in product["options"].items():
            parts += [name, *values]
        if state.options:
            parts.append("Selected: " + ", ".join(f"{k}: {v}" for k, v in state.options))
        parts += [product["Title"], f"Price: {product['Price']}", f"Rating: {product['Rating']}"]
        return SEP.join(parts + ["Description", "Features", "Reviews", "Attributes", "Buy Now"])

    @staticmethod
    def _sub_page(product: dict, sub: str) -> list[str]:
        if sub == "description":
            return [product["Description"] or "No description."]
        if sub == "features":
            return product["BulletPoints"] or ["No features."]
        if sub == "reviews":
            return [f"{r['score']} stars: {r['body']}" for r in product["Reviews"]] or ["No reviews."]
        return list(product["Attributes"])
