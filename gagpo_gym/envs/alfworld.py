"""ALFWorld's text games on the real engine: textworld's PDDL env with ALFWorld's own wrappers, one game at a time.

The engine is the one ALFWorld trains and evaluates on (``alfworld==0.4.2``): ``textworld.envs.PddlEnv`` wrapped in
``AlfredDemangler`` (object names like "apple 1") and ``AlfredInfos``. We drive a single game per env instance
instead of ``textworld.gym``'s batched subprocesses, so Gymnasium's vector envs do the batching.

* Games: every solvable ``game.tw-pddl`` under ``<data root>/json_2.1.1/<split>``, filtered the way ALFWorld's
  ``AlfredTWEnv`` filters them. ``reset(seed=s)`` plays ``games[s % len(games)]`` on every machine, the games
  ordered so that the task types take turns (each type's games in sorted path order): sorted paths group the
  games by type, so a small panel of seeds ``0..n`` would see one or two types; interleaved, 12 seeds cover all six.
* ``state_key``: blake2b of the engine's true state, its sorted PDDL facts. The key of the observation text
  instead (GiGPO's key; every invalid command shares the key of "Nothing happens.") is the key wrapper's
  (``wrappers.StateKey``, ``key="observation"`` or the back-off key ``"observation"``), so that the two can be
  compared (``scripts/alfworld_table.py``).
* ``expert_action(kind)``: one of ALFWorld's two experts (``AlfredExpert``, ``EXPERTS``): ``"planner"``,
  fast-downward's optimal plan from the true state, which wins every game; or ``"handcoded"``, ALFWorld's
  rule-based explorer, which sees only what the agent sees. ``kind=None`` plays the constructor's ``expert``
  (default ``"planner"``). Both run only when asked for, not after every step as ``AlfredExpert`` does.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import random
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

from gagpo_gym.core import TextEnv, normalize_command

SPLITS = ("train", "valid_seen", "valid_unseen")
#: ALFWorld's six task types: folder-name prefix -> short name.
TASK_TYPES = {
    "pick_and_place_simple": "pick",
    "look_at_obj_in_light": "look",
    "pick_clean_then_place_in_recep": "clean",
    "pick_heat_then_place_in_recep": "heat",
    "pick_cool_then_place_in_recep": "cool",
    "pick_two_obj_and_place": "pick2",
}
INSTALL_HINT = "pip install 'gagpo-gym[alfworld]'"
_TASK_PREFIX = "Your task is to: "
# A development checkout keeps the data beside the repository: <repo>/../shared/alfworld.
_CHECKOUT_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "alfworld"
# Where `alfworld-download` puts the data by default.
_ALFWORLD_CACHE = Path("~/.cache/alfworld").expanduser()


def find_data_root(data_root: str | os.PathLike | None = None) -> Path:
    """The ALFWorld data folder: ``data_root``, else ``$ALFWORLD_DATA``, else ``../shared/alfworld`` beside this
    checkout, else ``~/.cache/alfworld`` (where ``alfworld-download`` writes). An explicit choice must exist."""
    from_env = Path(os.environ.get("ALFWORLD_DATA") or _ALFWORLD_CACHE).expanduser()
    if data_root is not None:
        chosen = [(Path(data_root).expanduser(), "the data_root argument")]
    elif from_env != _ALFWORLD_CACHE:  # importing alfworld sets the variable to its default: not a choice
        chosen = [(from_env, "$ALFWORLD_DATA")]
    else:
        chosen = [(_CHECKOUT_DATA, "the checkout default"), (_ALFWORLD_CACHE, "ALFWorld's default")]
    for path, _ in chosen:
        if (path / "json_2.1.1").is_dir():
            return path.resolve()  # one canonical path, also when shared/ is reached through a link
    tried = "; ".join(f"{path} ({why})" for path, why in chosen)
    raise FileNotFoundError(
        f"no ALFWorld data found (looked for json_2.1.1/ in: {tried}). Pass data_root=..., or set ALFWORLD_DATA "
        "to a folder holding json_2.1.1/, or download the data with `alfworld-download`."
    )


@functools.lru_cache(maxsize=8)
def list_games(split_dir: Path) -> tuple[str, ...]:
    """Playable games of one split folder, as sorted POSIX paths relative to it (cached: a scan reads every file).

    The filter is ALFWorld's (``AlfredTWEnv.collect_game_files``): a ``traj_data.json`` beside the game, not a
    movable/sliced task, one of the six task types, and ``"solvable": true`` in the game file.
    """
    games = []
    for game_file in split_dir.glob("*/*/game.tw-pddl"):
        rel = game_file.relative_to(split_dir).as_posix()
        if "movable" in rel or "Sliced" in rel or _type_prefix(rel) not in TASK_TYPES:
            continue
        if not (game_file.parent / "traj_data.json").is_file():
            continue
        with open(game_file, encoding="utf-8") as f:
            if json.load(f).get("solvable"):
                games.append(rel)
    return tuple(sorted(games))


def _type_prefix(game: str) -> str:
    return game.split("/", 1)[0].split("-", 1)[0]


def interleave_task_types(games: Sequence[str]) -> tuple[str, ...]:
    """The games with their task types taking turns (``TASK_TYPES`` order, each type's games sorted by path).

    A type with fewer games drops out of the rotation when it runs out. Filtering the result by type gives the
    interleaving of the filtered games, so ``task_types=`` keeps the same relative order.
    """
    by_type: dict[str, list[str]] = {prefix: [] for prefix in TASK_TYPES}
    for game in sorted(games):
        by_type[_type_prefix(game)].append(game)
    rounds = itertools.zip_longest(*by_type.values())
    return tuple(game for row in rounds for game in row if game is not None)


@functools.cache
def _engine_api() -> dict[str, Any]:
    """Import textworld and ALFWorld's wrappers (lazily: they are an extra), or say what to install."""
    # alfworld.info writes ~/.cache/alfworld into ALFWORLD_DATA (and creates it) when the variable is unset;
    # leave the user's environment as it was.
    preset = "ALFWORLD_DATA" in os.environ
    os.environ.setdefault("ALFWORLD_DATA", str(_ALFWORLD_CACHE))
    try:
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
        from alfworld.agents.expert import HandCodedAgentFailed, HandCodedAgentTimeout, HandCodedTWAgent
        from textworld.envs import PddlEnv
        from textworld.envs.pddl.pddl import fast_downward_missing
    except ImportError as error:
        raise ImportError(f"ALFWorld-v0 needs ALFWorld's text engine: {INSTALL_HINT} ({error})") from error
    finally:
        if not preset:
            os.environ.pop("ALFWORLD_DATA", None)
    if fast_downward_missing:
        raise ImportError(f"ALFWorld-v0 needs fast-downward-textworld: {INSTALL_HINT}")

    class ReplayPddlEnv(PddlEnv):
        """textworld's ``PddlEnv`` that translates a game's PDDL once per load instead of once per reset.

        ``PddlEnv.load`` already builds the initial state (fast-downward's translator, 0.2-1 s); ``PddlEnv.reset``
        builds it again. Here ``load`` keeps a copy and ``reset`` restores it, so replaying a game costs only the
        intro text. Everything else is textworld's own code.
        """

        def load(self, filename_or_data: Any) -> None:
            super().load(filename_or_data)
            self._initial_state = _copy_pddl_state(self._pddl_state)

        def reset(self) -> Any:
            self._pddl_state = _copy_pddl_state(self._initial_state)
            lib = self._pddl_state.downward_lib
            lib.load_sas(self._pddl_state.sas.encode("utf-8"))
            lib.load_sas_replan(self._pddl_state.sas_replan.encode("utf-8"))
            self.prev_state = None
            self.state = textworld.core.GameState()
            self._last_action = None
            self._moves = 0
            context = {
                "state": self._pddl_state,
                "facts": list(self._pddl_state.facts),
                "variables": {},
                "mapping": {},
                "entity_infos": self._entity_infos,
            }
            self.state.feedback = self._logic.grammar.derive("#intro#", context)
            self.state.raw = self.state.feedback
            self._gather_infos()
            return self.state

    return {
        "EnvInfos": textworld.EnvInfos,
        "PddlEnv": ReplayPddlEnv,
        "AlfredDemangler": AlfredDemangler,
        "AlfredInfos": AlfredInfos,
        "HandCodedTWAgent": HandCodedTWAgent,
        "expert_gave_up": (HandCodedAgentFailed, HandCodedAgentTimeout),
    }


def _copy_pddl_state(state: Any) -> Any:
    """Copy of a textworld ``PddlState``: the fact tables are copied (``State.copy``'s way), the parsed task and
    the planner library are shared."""
    copy = object.__new__(type(state))
    copy.__dict__.update(state.__dict__)
    copy._facts = defaultdict(set, {sig: set(facts) for sig, facts in state._facts.items()})
    copy._vars_by_name = dict(state._vars_by_name)
    copy._vars_by_type = defaultdict(set, {t: set(vs) for t, vs in state._vars_by_type.items()})
    copy._var_counts = Counter(state._var_counts)
    return copy


@contextlib.contextmanager
def _global_random_from(rng: random.Random) -> Iterator[None]:
    """Run code that draws from the global ``random`` module (ALFWorld's handcoded expert) on ``rng`` instead."""
    outer = random.getstate()
    random.setstate(rng.getstate())
    try:
        yield
    finally:
        rng.setstate(random.getstate())
        random.setstate(outer)


class ALFWorldEnv(TextEnv):
    """One ALFWorld game at a time on the real text engine.

    Args:
        split: ``"train"``, ``"valid_seen"`` (ALFWorld's eval in distribution, 140 games) or ``"valid_unseen"``
            (out of distribution, 134 games).
        data_root: folder with ``json_2.1.1/``; default ``$ALFWORLD_DATA``, then ``../shared/alfworld``
            beside the checkout, then ``~/.cache/alfworld``.
        task_types: keep only these short type names (``pick``, ``look``, ``clean``, ``heat``, ``cool``,
            ``pick2``); default all six.
        expert: the kind ``expert_action()`` plays when none is asked for (eval tables pick it through the env
            kwargs): ``"planner"`` (fast-downward on the true state: optimal and always wins, but a first plan can
            take seconds on two-object tasks) or ``"handcoded"`` (ALFWorld's explorer: fast and realistic, but it
            seldom finishes ``pick2`` within 50 steps).
        render_mode: ``"ansi"`` or ``"human"``.
    """

    #: The kinds of :meth:`expert_action`.
    EXPERTS = ("planner", "handcoded")
    #: The planner is deterministic: its plan from a game's initial state is shared by every env in the process.
    _initial_plans: ClassVar[dict[str, tuple[str, ...]]] = {}

    def __init__(
        self,
        split: str = "valid_unseen",
        data_root: str | os.PathLike | None = None,
        task_types: list[str] | tuple[str, ...] | None = None,
        expert: str = "planner",
        render_mode: str | None = None,
    ) -> None:
        super().__init__(render_mode=render_mode)
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        known = tuple(TASK_TYPES.values())
        if task_types is not None and (
            isinstance(task_types, str) or not task_types or any(t not in known for t in task_types)
        ):
            raise ValueError(f"task_types must be a non-empty list drawn from {known}, got {task_types!r}")
        if expert not in self.EXPERTS:
            raise ValueError(f"expert must be one of {self.EXPERTS}, got {expert!r}")
        self.split = split
        self.expert = expert
        self.data_root = find_data_root(data_root)
        split_dir = self.data_root / "json_2.1.1" / split
        if not split_dir.is_dir():
            hint = " (the train split comes with `alfworld-download`)" if split == "train" else ""
            raise FileNotFoundError(f"ALFWorld split folder {split_dir} is missing{hint}")
        games = interleave_task_types(list_games(split_dir))
        if task_types is not None:
            games = tuple(g for g in games if TASK_TYPES[_type_prefix(g)] in task_types)
        if not games:
            raise FileNotFoundError(f"no playable ALFWorld games under {split_dir}")
        self.games: tuple[str, ...] = games
        self._split_dir = split_dir

        self._api = _engine_api()
        request = self._api["EnvInfos"](won=True, admissible_commands=True, facts=True, extras=["gamefile"])
        pddl_env = self._api["PddlEnv"](request)
        self._engine = self._api["AlfredInfos"](self._api["AlfredDemangler"](pddl_env, shuffle=False))
        self._pddl_env = pddl_env
        self._loaded: str | None = None
        self.game_file = ""
        self._game_state: Any = None
        self._admissible: list[str] = []
        # Planner expert: the plan being followed. Handcoded expert: the agent, its RNG, and the
        # (state, command) pairs it has not seen yet.
        self._plan: list[str] | None = None
        self._handcoded: Any = None
        self._handcoded_rng = random.Random(0)
        self._handcoded_pending: list[tuple[Any, str]] = []
        self._handcoded_next = "look"

    # ----- Gymnasium API --------------------------------------------------------------------------------
    def close(self) -> None:
        self._engine.close()
        super().close()

    # ----- TextEnv hooks ------------------------------------------------------------------------------
    def _new_task(self, seed: int | None, options: dict[str, Any]) -> str:
        # the seed picks the game
        index = seed % len(self.games) if seed is not None else int(self.np_random.integers(len(self.games)))
        game = self.games[index]
        if game != self._loaded:  # a group replays one game many times: load (parse) it once
            self._engine.load(str(self._split_dir / game))
            self._loaded = game
            self.game_file = str(self._split_dir / game)
        self._set_state(self._engine.reset())
        self.task_id = f"json_2.1.1/{self.split}/{game}"
        self.task_type = TASK_TYPES[_type_prefix(game)]
        intro = self._game_state.feedback
        self.task = intro.rsplit(_TASK_PREFIX, 1)[-1].strip().rstrip(".") if _TASK_PREFIX in intro else ""
        self._plan = list(self._initial_plans.get(self.game_file, ())) or None
        self._handcoded = None
        self._handcoded_rng.seed(int(self.np_random.integers(2**32)))
        self._handcoded_pending = [(self._game_state, "")]
        return intro

    def _execute(self, command: str) -> tuple[str, float, bool]:
        game_state, _, _ = self._engine.step(command)
        self._set_state(game_state)
        if self._plan and self._plan[0] == command:
            self._plan.pop(0)
        else:
            self._plan = None
        self._handcoded_pending.append((game_state, command))  # the handcoded expert's, whenever it is asked
        return game_state.feedback, (1.0 if self.won else 0.0), self.won

    def _set_state(self, game_state: Any) -> None:
        self._game_state = game_state
        self.won = bool(game_state["won"])
        self._admissible = [c for c in game_state["admissible_commands"] if c != "help" and c == normalize_command(c)]

    def admissible_actions(self) -> list[str]:
        return list(self._admissible)

    def canonical_action(self, action: Any) -> str | None:
        command = normalize_command(action)
        return command if command in self._admissible else None

    def state_string(self) -> str:
        """The engine's true state: its PDDL facts, sorted, one per line."""
        return "\n".join(sorted(str(fact) for fact in self._game_state["facts"]))

    def expert_action(self, kind: str | None = None) -> str:
        """Next command of ALFWorld's expert ``kind`` (``None``: the constructor's ``expert``); "look" once won
        or when the expert gives up."""
        kind = self.expert if kind is None else self._expert_kind(kind)
        if self.won:
            return "look"
        if kind == "planner":
            return self._planner_action()
        return self._handcoded_action()

    # ----- experts ------------------------------------------------------------------------------------
    def _planner_action(self) -> str:
        """ALFWorld's planner expert (``AlfredExpert(expert_type="planner")``), replanned only off its plan."""
        if not self._plan:
            at_start = self._pddl_env._moves == 0
            self._plan = self._pddl_env._pddl_state.replan(self._pddl_env._entity_infos)
            if at_start:
                self._initial_plans[self.game_file] = tuple(self._plan)
        return self._plan[0] if self._plan else "look"

    def _handcoded_action(self) -> str:
        """ALFWorld's handcoded expert, fed every state since the last call (``AlfredExpert``'s protocol)."""
        api = self._api
        with _global_random_from(self._handcoded_rng):
            for game_state, command in self._handcoded_pending:
                if not command:  # the episode's first state
                    self._handcoded = api["HandCodedTWAgent"](max_steps=200)
                    self._handcoded.reset(self.game_file)
                    self._handcoded.observe(game_state.feedback)
                    self._handcoded_next = "look"
                elif self._handcoded is not None:
                    try:
                        action = self._handcoded.act(game_state, 0, game_state["won"], command)
                    except api["expert_gave_up"]:
                        self._handcoded, action = None, "look"
                    admissible = game_state["admissible_commands"]
                    self._handcoded_next = action if action in admissible and action != "help" else "look"
        self._handcoded_pending = []
        return self._handcoded_next
