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
  compared (``lab/tables/alfworld_games.py``).
* ``expert_action(kind)``: one of ALFWorld's two experts (``AlfredExpert``, ``EXPERTS``): ``"planner"``,
  fast-downward's optimal plan from the true state, which wins every game; or ``"handcoded"``, ALFWorld's
  rule-based explorer, which sees only what the agent sees. ``kind=None`` plays the constructor's ``expert``
  (default ``"planner"``). Both run only when asked for, not after every step as ``AlfredExpert`` does.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import gzip
import hashlib
import io
import itertools
import json
import os
import random
import tarfile
import tempfile
from collections import Counter, OrderedDict, defaultdict
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
# The train split ships as an archive beside the evaluation splits; it is unpacked once into the checkout's ignored
# cache folder (`make alfworld-train`), never into shared data and never into the repository's tracked files.
_CHECKOUT_CACHE = Path(__file__).resolve().parents[2] / ".cache" / "alfworld"
TRAIN_ARCHIVE = "train.tar.xz"
# Where `alfworld-download` puts the data by default.
_ALFWORLD_CACHE = Path("~/.cache/alfworld").expanduser()


def find_data_root(data_root: str | os.PathLike | None = None, split: str | None = None) -> Path:
    """The ALFWorld data folder: ``data_root``, else ``$ALFWORLD_DATA``, else ``../shared/alfworld`` beside this
    checkout, else the checkout's ``.cache/alfworld`` (the unpacked train split), else ``~/.cache/alfworld`` (where
    ``alfworld-download`` writes). An explicit choice must exist. With ``split``, the first candidate holding that
    split wins, so the evaluation splits can come from shared data and the train split from the cache."""
    from_env = Path(os.environ.get("ALFWORLD_DATA") or _ALFWORLD_CACHE).expanduser()
    if data_root is not None:
        chosen = [(Path(data_root).expanduser(), "the data_root argument")]
    elif from_env != _ALFWORLD_CACHE:  # importing alfworld sets the variable to its default: not a choice
        chosen = [(from_env, "$ALFWORLD_DATA")]
    else:
        chosen = [
            (_CHECKOUT_DATA, "the checkout default"),
            (_CHECKOUT_CACHE, "the checkout's unpacked train split"),
            (_ALFWORLD_CACHE, "ALFWorld's default"),
        ]
    found = [path for path, _ in chosen if (path / "json_2.1.1").is_dir()]
    if split is not None:
        with_split = [path for path in found if (path / "json_2.1.1" / split).is_dir()]
        found = with_split or found  # none has it: the first root, whose missing split folder the env names
    if found:
        return found[0].resolve()  # one canonical path, also when shared/ is reached through a link
    tried = "; ".join(f"{path} ({why})" for path, why in chosen)
    raise FileNotFoundError(
        f"no ALFWorld data found (looked for json_2.1.1/ in: {tried}). Pass data_root=..., or set ALFWORLD_DATA "
        "to a folder holding json_2.1.1/, or download the data with `alfworld-download`."
    )


def unpack_train_split(archive: str | os.PathLike | None = None, dest: str | os.PathLike | None = None) -> Path:
    """Unpack the train split's archive (``train.tar.xz``, 3,553 games) into ``dest`` once; returns ``dest``.

    Defaults: the archive beside the checkout's shared data, ``dest`` the checkout's ignored ``.cache/alfworld``,
    where :func:`find_data_root` looks for the train split. The games are extracted into a temporary folder and
    renamed into place, so an interrupted unpack never looks like a split; a second call finds the split and
    returns at once.
    """
    archive = Path(archive) if archive is not None else _CHECKOUT_DATA / TRAIN_ARCHIVE
    dest = Path(dest) if dest is not None else _CHECKOUT_CACHE
    target = dest / "json_2.1.1" / "train"
    if target.is_dir():
        return dest
    if not archive.is_file():
        raise FileNotFoundError(
            f"ALFWorld's train archive {archive} is missing: pass its path, or get the train games with "
            "`alfworld-download` and set ALFWORLD_DATA to their folder"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest, prefix=".unpacking-") as tmp:
        with tarfile.open(archive, "r:xz") as tar:
            tar.extractall(tmp, filter="data")
        unpacked = Path(tmp) / "json_2.1.1" / "train"
        if not unpacked.is_dir():
            raise FileNotFoundError(f"{archive} holds no json_2.1.1/train folder")
        unpacked.rename(target)
    return dest


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
        import fast_downward
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
    _memoize_text_generation()
    _keep_translations()

    class ReplayPddlEnv(PddlEnv):
        """textworld's ``PddlEnv`` that translates a game's PDDL once per process instead of once per reset.

        ``PddlEnv.load`` builds the initial state with fast-downward's translator (0.5-2 s) and ``PddlEnv.reset``
        builds it again. Here the first ``load`` of a game file in the process keeps a copy of what it built
        (``LOADED_GAMES``), later loads of that file (the other members of a rollout group, each an env of its
        own) copy it instead of translating, and ``reset`` restores the copy. Each env keeps its own copy of
        fast-downward's library (textworld loads one per env), so the copied state is rebound to it; a closed env
        gives its library back to ``FREE_LIBRARIES`` for the next env of the process. Everything else is textworld's
        own code.
        """

        def __init__(self, infos: Any = None) -> None:
            # PddlEnv.__init__, with a library a closed env gave back where there is one: fast_downward.load_lib
            # copies its 34 MB library to a temporary file and loads that (its state is global: one per env), so
            # each env built meant 34 MB written to disk and mapped for the rest of the process.
            textworld.Environment.__init__(self, infos)
            try:  # one pop, not a look then a pop: envs may be built in two threads
                self.downward_lib = FREE_LIBRARIES.pop()
            except IndexError:
                self.downward_lib = fast_downward.load_lib()

        def close(self) -> None:
            # getattr: textworld's __del__ closes an env whose __init__ failed before it had a library
            if getattr(self, "downward_lib", None) is not None:  # each game and reset loads its task into it anew
                FREE_LIBRARIES.append(self.downward_lib)
                self.downward_lib = None
            super().close()

        def load(self, filename_or_data: Any) -> None:
            key = str(filename_or_data) if isinstance(filename_or_data, (str, os.PathLike)) else None
            cached = LOADED_GAMES.get(key) if key is not None else None
            if cached is None:
                super().load(filename_or_data)
                self._initial_state = _copy_pddl_state(self._pddl_state)
                if key is not None:
                    remember_game(key, (self._game_data, self._logic, self._initial_state))
                return
            self._game_file = filename_or_data
            self._game_data, self._logic, initial = cached
            self.walkthrough = self._game_data.get("walkthrough", None)
            self._initial_state = _copy_pddl_state(initial)
            self._initial_state.downward_lib = self.downward_lib
            self._pddl_state = _copy_pddl_state(self._initial_state)
            self._entity_infos = self._get_entity_infos()

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


#: fast-downward libraries of closed envs, for the next envs of this process (``ReplayPddlEnv``): as many copies as
#: envs were ever open at once, not one per env built.
FREE_LIBRARIES: list[Any] = []

#: Games translated in this process: game file -> (game data, game logic, initial state), oldest first. A rollout
#: group plays one game in group_size envs, and a few groups run side by side: a handful of games suffices.
LOADED_GAMES: OrderedDict[str, tuple[Any, Any, Any]] = OrderedDict()
LOADED_GAMES_MAX = 16


def remember_game(key: str, loaded: tuple[Any, Any, Any]) -> None:
    LOADED_GAMES[key] = loaded
    while len(LOADED_GAMES) > LOADED_GAMES_MAX:
        LOADED_GAMES.popitem(last=False)


#: fast-downward's translations (SAS text, gzip) by sha256 of their input, kept across processes and runs in the
#: checkout's ignored cache; None keeps none (every process translates each game it loads).
SAS_CACHE: Path | None = _CHECKOUT_CACHE.parent / "alfworld-sas"


def _keep_translations() -> None:
    """Make fast-downward's PDDL-to-SAS translation (about 1.5 s a call, two calls per game: two thirds of an
    evaluation's time on games not played before in the process) happen once per game per machine.

    ``pddl2sas(domain, problem, optimize)`` returns the parsed, normalised task and its SAS text; the SAS text is a
    deterministic function of the inputs (the translator's own, ``tests/test_alfworld.py`` checks), so it is kept
    as text under :data:`SAS_CACHE`, named by the sha256 of the inputs and the translator's package version. A later
    call parses and normalises the task (a twentieth of the time) and reads the text. The task the translator
    returns is the parsed, normalised one: the translation reads it and changes nothing in it (checked too).
    """
    import fast_downward

    if getattr(fast_downward, "_gagpo_kept", False):
        return
    from importlib.metadata import version

    translate = fast_downward.pddl2sas
    translator = version("fast-downward-textworld")

    def pddl2sas(domain: str, problem: str, verbose: bool = False, optimize: bool = False) -> Any:
        if SAS_CACHE is None or verbose:
            return translate(domain, problem, verbose=verbose, optimize=optimize)
        key = hashlib.sha256(json.dumps([translator, bool(optimize), domain, problem]).encode("utf-8")).hexdigest()
        path = SAS_CACHE / key[:2] / f"{key}.sas.gz"
        if not path.is_file():
            task, sas = translate(domain, problem, verbose=verbose, optimize=optimize)
            with contextlib.suppress(OSError):  # a cache that cannot be written only costs the next translation
                path.parent.mkdir(parents=True, exist_ok=True)
                with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, suffix=".tmp") as out:
                    out.write(gzip.compress(sas.encode("utf-8"), mtime=0))
                os.replace(out.name, path)
            return task, sas
        return parsed_task(domain, problem), gzip.decompress(path.read_bytes()).decode("utf-8")

    fast_downward.pddl2sas = pddl2sas
    fast_downward._gagpo_kept = True


def parsed_task(domain: str, problem: str) -> Any:
    """The task ``fast_downward.pddl2sas`` returns, without its translation: parsed and normalised, its output
    silenced (it warns of atoms listed twice) as the translator silences it."""
    import sys

    if "fast_downward.translate.options" not in sys.modules:  # its options parse sys.argv on import, as pddl2sas
        sys.argv = ["translate.py", "domain", "task"]  # sets it before importing them
    from fast_downward.translate import normalize
    from fast_downward.translate.pddl_parser import lisp_parser, parsing_functions

    with contextlib.redirect_stdout(io.StringIO()):
        task = parsing_functions.parse_task(
            lisp_parser.parse_nested_list(domain.split("\n")), lisp_parser.parse_nested_list(problem.split("\n"))
        )
        normalize.normalize(task)
    return task


def _memoize_text_generation() -> None:
    """Make textworld's text generator stop re-parsing the same grammar strings, with the same output.

    Every step, ``PddlEnv`` derives the text of each admissible command and of the feedback from ALFWorld's
    grammar. textworld's generator parses each template with a TatSu parser on every use (about 60 parses a step)
    and deep-copies each derivation context, though only its two dicts are ever updated, never their values. Here
    the parse of each (template, rule) is computed once and handed out as a fresh copy, each conjunctive query is
    parsed once, and a context copy copies its dicts, not their values. About 7x fewer seconds per step on
    ALFWorld's games; the text, the admissible commands and the facts are those of textworld's own generator
    (``tests/test_alfworld.py`` plays the same commands on an unpatched engine in another process and compares).
    """
    from textworld.envs.pddl import textgen

    if getattr(textgen, "_gagpo_memoized", False):
        return
    parse = textgen._parse_and_convert
    conjunctive_query = textgen.Rule.parse_conjunctive_query

    @functools.cache
    def parsed(text: str, rule_name: str) -> Any:
        return parse(text, rule_name=rule_name)

    def parse_and_convert(text: str, rule_name: str, trace: bool = False) -> Any:
        if trace:  # textworld's debugging flag (TW_CSG_TRACE): its own parser, which prints the trace
            return parse(text, rule_name=rule_name, trace=trace)
        return copy.deepcopy(parsed(text, rule_name))

    class Rule:
        """The one name textgen uses from ``textworld.logic.Rule``: its conjunctive-query parser, memoized."""

        parse_conjunctive_query = staticmethod(functools.cache(conjunctive_query))

    def copy_context(context: dict[str, Any]) -> dict[str, Any]:
        return {
            "state": context["state"],
            "facts": context["facts"],
            "variables": dict(context["variables"]),
            "mapping": dict(context["mapping"]),
            "entity_infos": context["entity_infos"],
        }

    def copy_symbol(self: Any, context: dict[str, Any]) -> Any:
        own, self.context = self.context, {}  # the deep copy's context is replaced below: do not copy it
        try:
            duplicate = copy.deepcopy(self)
        finally:
            self.context = own
        duplicate.context = copy_context(context)
        return duplicate

    textgen._parse_and_convert = parse_and_convert
    textgen.Rule = Rule
    textgen.copy_context = copy_context
    textgen.Symbol.copy = copy_symbol
    textgen._gagpo_memoized = True


def _copy_pddl_state(state: Any) -> Any:
    """Copy of a textworld ``PddlState``: the fact tables are copied (``State.copy``'s way), the parsed task and
    the planner library are shared."""
    duplicate = object.__new__(type(state))
    duplicate.__dict__.update(state.__dict__)
    duplicate._facts = defaultdict(set, {sig: set(facts) for sig, facts in state._facts.items()})
    duplicate._vars_by_name = dict(state._vars_by_name)
    duplicate._vars_by_type = defaultdict(set, {t: set(vs) for t, vs in state._vars_by_type.items()})
    duplicate._var_counts = Counter(state._var_counts)
    return duplicate


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
            beside the checkout, then the checkout's ``.cache/alfworld`` (``make alfworld-train`` unpacks the
            train split there), then ``~/.cache/alfworld``; the first that holds ``split``.
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
        self.data_root = find_data_root(data_root, split)
        split_dir = self.data_root / "json_2.1.1" / split
        if not split_dir.is_dir():
            hint = (
                " (unpack the train games once with `make alfworld-train`, or get them with `alfworld-download`)"
                if split == "train"
                else ""
            )
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
        self._target_type = ""  # the PDDL type of the task's target object (traj_data.json's object_target)
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
        #: The handcoded expert gave up in this episode (ALFWorld's HandCodedAgentFailed / Timeout): its "look"
        #: from then on is no advice, and an imitation dataset should not learn it.
        self.expert_gave_up = False

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
            with open(self._split_dir / game.rsplit("/", 1)[0] / "traj_data.json", encoding="utf-8") as f:
                self._target_type = json.load(f)["pddl_params"]["object_target"].lower() + "type"
        self._set_state(self._engine.reset())
        self.task_id = f"json_2.1.1/{self.split}/{game}"
        self.task_type = TASK_TYPES[_type_prefix(game)]
        intro = self._game_state.feedback
        self.task = intro.rsplit(_TASK_PREFIX, 1)[-1].strip().rstrip(".") if _TASK_PREFIX in intro else ""
        self._plan = list(self._initial_plans.get(self.game_file, ())) or None
        self._handcoded = None
        self._handcoded_rng.seed(int(self.np_random.integers(2**32)))
        self._handcoded_pending = [(self._game_state, "")]
        self.expert_gave_up = False
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

    def target_stage(self) -> int:
        """How far the agent is towards an object of the task's target type now, from the engine's facts, on
        MiniHouse's scale (``House.target_stage``): 3 holds one, 2 stands at a receptacle where one is in view, 1
        stands at a shut receptacle holding one, 0 none of these. An episode's highest stage says where a failure
        stopped: the search (0), opening (1), taking (2), or what follows the take (3)."""
        facts: dict[str, list[tuple[str, ...]]] = defaultdict(list)
        for fact in self._game_state["facts"]:
            facts[fact.name].append(tuple(arg.name.strip() for arg in fact.arguments))  # "booktype " -> "booktype"
        targets = {obj for obj, otype in facts["objecttype"] if otype == self._target_type}
        if any(obj in targets for _, obj in facts["holds"]):
            return 3
        here = {loc for _, loc in facts["atlocation"]}
        holding = {rec for obj, rec in facts["inreceptacle"] if obj in targets}
        at = {rec for rec, loc in facts["receptacleatlocation"] if loc in here and rec in holding}
        if not at:
            return 0
        shut = {(rec,) for rec in at} & set(facts["openable"]) - set(facts["opened"])
        return 1 if len(shut) == len(at) else 2

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
                        self.expert_gave_up = True
                    admissible = game_state["admissible_commands"]
                    self._handcoded_next = action if action in admissible and action != "help" else "look"
        self._handcoded_pending = []
        return self._handcoded_next
