"""MiniShop: a WebShop-protocol shopping env with WebShop's reward (``gagpo_gym/MiniShop-v0``)."""

from gagpo_gym.envs.minishop.catalog import Catalog, generated_catalog, load_webshop
from gagpo_gym.envs.minishop.env import MiniShopEnv, search_candidates
from gagpo_gym.envs.minishop.reward import get_reward

__all__ = ["Catalog", "MiniShopEnv", "generated_catalog", "get_reward", "load_webshop", "search_candidates"]
