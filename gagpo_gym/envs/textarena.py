"""TextArena games (``pip install gagpo-gym[textarena]``, textarena 0.7.4) as gagpo_gym text envs: one adapter.

:class:`TextArenaEnv` wraps one raw TextArena game (no TextArena wrapper: its default observation wrapper repeats
the whole history, and our prompt wrappers keep history themselves) behind the text-env contract. The game's
prompt is ``info["task"]``; each observation is the new text the game sent since the last one. What differs
per game is one :class:`Game` row of :data:`GAMES` (the TextArena id and settings, how its legal moves are
listed, what of its state is the key, an expert where a cheap exact one exists).

Behaviour common to all games:

* **Seeds.** ``reset(seed=s)`` builds a fresh TextArena game (some draw their puzzle in the constructor) and
  resets it with ``s``. TextArena draws from the global ``random`` module; each adapter keeps a stream of its own
  and swaps it in around every call into the game, so envs stepped side by side in one process (a grouped
  vector env) stay reproducible. Their prints go to a buffer, not to stdout.
* **Moves.** ``admissible_actions`` lists the legal moves in the game's own spelling (``[A C]``, ``[up]``,
  ``[3 2]``); the agent's text is matched to one with :func:`gagpo_gym.core.match_command` (case, whitespace)
  and only that spelling reaches the game, so an answer that smuggles in two moves is one invalid move. After
  the end the only admissible command is ``pass``, which changes nothing.
* **Invalid moves.** ``invalid_move="penalty"`` (default): a move the game rejects (or text that is no legal
  move) leaves the game exactly as it was (the adapter restores a copy taken before the step), with
  ``action_valid=False``, reward 0, and the episode goes on; TextArena's error allowance never ends it.
  ``invalid_move="game"``: TextArena's own rule; unmatched text is sent to the game as it is, and after its
  allowance (one warning) the game ends as a loss.
* **Turn limits.** TextArena's own turn limit is lifted where the game checks it through its state (the prompt
  still names the number) and the id's ``max_episode_steps`` (Gymnasium's ``TimeLimit``, which truncates; set
  where the id is registered, :data:`gagpo_gym.registration.TEXTARENA_GAMES`) applies instead; the table says
  where a limit is part of the game's rules and stays.
* **Outcome.** ``won`` is TextArena's end reward reaching 1 for the learner (two-player: TextArena's +1); the
  reward is 1 on a win, else 0; a single-player game's end reward in [0, 1] (TextArena's partial credit) is
  ``info["score"]`` on the last step.
* **Keys.** ``state_key`` hashes the canonical JSON (sorted keys, stable encoding of tuples, sets and numpy
  arrays) of the game's true state, hidden parts included (the secret code, the mines, the dealer's card).
  Counters that do not change what can happen next are left out.
* **Two-player games** are single-agent envs against a fixed opponent: ``opponent="random"`` (a uniform legal
  move from the env's own stream) or a callable ``opponent(observation, legal_moves) -> move`` (its answer is
  matched to a legal move; a reply that is none raises ``ValueError``, being a bug in the caller's policy).
  ``learner`` is ``"first"``, ``"second"`` or ``"random"`` (drawn per task).

Registered games (``gagpo_gym/TextArena-<Game>-v0``, by :func:`gagpo_gym.registration.register_builtin_envs`; without
textarena installed, making one raises an ImportError that says how to install it; the TextArena id and settings
they use):

============== ================================ ======================================= ===================== ======
game           TextArena id, settings           moves (admissible)                      key (what is left out) expert
============== ================================ ======================================= ===================== ======
TowerOfHanoi   TowerOfHanoi-v0, 3 disks         legal ``[X Y]`` of 6                    towers                optimal
FrozenLake     FrozenLake-v0, 4x4, 3 holes      ``[up]`` ... in bounds (<= 4)           grid, position        BFS
GuessTheNumber GuessTheNumber-v0, 1-20          ``[n]`` not yet guessed (<= 20)         number, history       bisect
Mastermind     Mastermind-v0, 4 of 6            every new guess (360; generate mode)    code, history         consistent
Minesweeper    Minesweeper-v0-small, 5x5/5      ``[r c]`` unrevealed (<= 25)            mines, revealed       -
LightsOut      LightsOut-v0, 5x5                ``[r c]`` (25)                          grid, moves made (*)  GF(2)
2048           2048-v0-super-easy, to 128    directions that move tiles (<= 4)       board, score          -
Blackjack      Blackjack-v0, 1 hand             ``[Hit]``, ``[Stand]``                  hands (dealer's too)  -
FifteenPuzzle  FifteenPuzzle-v0                 legal slides (<= 4)                     board (not the text)  -
Sokoban        Sokoban-v0, 6x6, 3 boxes         legal moves (<= 4)                      room                  -
Countdown      Countdown-v0, 6 numbers          legal ``[i j op]`` (<= 120)             numbers, target, best -
Cryptarithm    Cryptarithm-v0, SEND+MORE=MONEY  legal ``[L d]`` (<= 80)                 mapping               -
Secretary      Secretary-v0, 5 draws            ``[accept]``, ``[continue]``            draws, index          -
ThreeCardMonte ThreeCardMonte-v0, 3 cups        ``[k]`` (3)                             ball                  -
RushHour       RushHour-v0                      legal ``[A+]``/``[A-]``                 vehicles              -
PegJump        PegJump-v0, hole 5 empty         legal ``[f t]`` jumps                   pegs                  DFS
Slitherlink    Slitherlink-v0, 4x4              ``[h r c]``/``[v r c]`` edges (40)      clues, edges          -
TicTacToe      TicTacToe-v0, vs opponent        ``[n]`` empty cells                     board, side, mover    -
ConnectFour    ConnectFour-v0, vs opponent      ``[col c]`` open columns                board, side, mover    -
Nim            Nim-v0, piles 3 4 5              legal ``[pile n]``                      piles, side, mover    xor
KuhnPoker      KuhnPoker-v0, 3 rounds           legal ``[Check]``/``[Bet]``/...         cards, chips, round   -
============== ================================ ======================================= ===================== ======

(*) LightsOut keeps its own limit (20 moves; every observation counts the moves left), so the moves made are in
its key. Mastermind's 360 guesses make choose mode score 360 candidates a step: generate mode is the practical
way there. Half of FifteenPuzzle's shuffles are unsolvable (TextArena permutes the tiles at random), and it calls
a method its single-player state lacks when solved; the adapter supplies it.

TextArena single-player games not registered, tried with the network blocked: Hangman, WordLadder, Wordle and
WordSearch download nltk corpora at import; GuessWho and TwentyQuestions need an OpenRouter API key (an LLM
game master); BabyAiText needs ``gym`` and ``gym-minigrid``; Klondike does not import (a syntax error in
0.7.4). Crosswords and Sudoku run offline, but only the solution's letters/digits are legal moves there, so the
admissible list would give the answer away. Set has no win (it scores the sets found in 20 turns). Bandit cannot
be won in 0.7.4 (it compares the chosen button with the dict of all the buttons' means). LogicPuzzle runs offline
and is not mapped yet (its true board lives outside its game state).
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.util
import io
import itertools
import json
import math
import random
import types
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from gagpo_gym.core import TextEnv, match_command, to_charset

INVALID_MOVES = ("penalty", "game")
INSTALL_HINT = "pip install 'gagpo-gym[textarena]'"
#: Every game's id is this prefix, the game's name and ``-v0``.
GAGPO_TEXTARENA_PREFIX = "gagpo_gym/TextArena-"
SIDES = ("first", "second", "random")
#: The one admissible command once the game is over (the built-in board games' convention): it changes nothing.
GAME_OVER_MOVE = "pass"
#: An opponent policy: (the opponent's observation text, its legal moves) -> its move.
Opponent = Callable[[str, list[str]], str]


# ----- canonical state -------------------------------------------------------------------------------------
def _plain(value: Any) -> Any:
    """``value`` as JSON-able data with one spelling per state: dict keys become strings and are sorted by
    ``json.dumps``, sets are sorted, tuples become lists, numpy arrays lists, objects with ``__slots__`` dicts."""
    if isinstance(value, dict):
        return {
            json.dumps(_plain(k), sort_keys=True) if not isinstance(k, str) else k: _plain(v) for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_plain(v) for v in value), key=lambda v: json.dumps(v, sort_keys=True))
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return value.tolist()
    if hasattr(value, "__slots__"):
        return {name: _plain(getattr(value, name)) for name in value.__slots__}
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


def canonical_state(value: Any) -> str:
    """Sorted, compact JSON of a game state: the text :func:`gagpo_gym.core.state_key` hashes."""
    return json.dumps(_plain(value), sort_keys=True, separators=(",", ":"), ensure_ascii=True)


# ----- per-game move lists, states and experts -------------------------------------------------------------
def _gs(game: Any) -> dict[str, Any]:
    return game.state.game_state


def _hanoi_moves(game: Any) -> list[str]:
    towers = _gs(game)["towers"]
    return [
        f"[{a} {b}]"
        for a, b in itertools.permutations("ABC", 2)
        if towers[a] and (not towers[b] or towers[b][-1] > towers[a][-1])
    ]


def _hanoi_expert(game: Any) -> str:
    """The next move of the shortest solution from any position: to bring disks 1..n onto a peg, bring n there
    if 1..n-1 wait on the spare peg, else first bring 1..n-1 to the spare peg."""
    where = {disk: peg for peg, disks in _gs(game)["towers"].items() for disk in disks}

    def move(disk: int, target: str) -> str:
        source = where[disk]
        if source == target:
            return move(disk - 1, target)
        spare = ({"A", "B", "C"} - {source, target}).pop()
        if all(where[d] == spare for d in range(1, disk)):
            return f"[{source} {target}]"
        return move(disk - 1, spare)

    if all(peg == "C" for peg in where.values()):
        return _hanoi_moves(game)[0]
    return move(len(where), "C")


_DIRECTIONS = ("[up]", "[down]", "[left]", "[right]")
_STEPS = {"[up]": (-1, 0), "[down]": (1, 0), "[left]": (0, -1), "[right]": (0, 1)}


def _frozenlake_moves(game: Any) -> list[str]:
    r, c = _gs(game)["player_pos"]
    return [m for m, (dr, dc) in _STEPS.items() if 0 <= r + dr < game.size and 0 <= c + dc < game.size]


def _frozenlake_expert(game: Any) -> str:
    """First move of a shortest hole-free path to the goal (BFS); any legal move where there is none."""
    grid, start, goal = _gs(game)["grid"], tuple(_gs(game)["player_pos"]), tuple(_gs(game)["goal_pos"])
    first: dict[tuple[int, int], str | None] = {start: None}
    queue = deque([start])
    while queue:
        r, c = queue.popleft()
        if (r, c) == goal:
            return first[goal] or _frozenlake_moves(game)[0]
        for move, (dr, dc) in _STEPS.items():
            nxt = (r + dr, c + dc)
            if 0 <= nxt[0] < game.size and 0 <= nxt[1] < game.size and nxt not in first and grid[nxt[0]][nxt[1]] != "H":
                first[nxt] = first[(r, c)] or move
                queue.append(nxt)
    return _frozenlake_moves(game)[0]


def _guess_moves(game: Any) -> list[str]:
    return [f"[{n}]" for n in range(game.min_number, game.max_number + 1) if n not in game.guessed_numbers]


def _guess_expert(game: Any) -> str:
    """Bisection of the range the hints leave."""
    low, high = game.min_number, game.max_number
    for guess, hint in _gs(game)["guess_history"]:
        if hint == "higher":
            low = max(low, guess + 1)
        else:
            high = min(high, guess - 1)
    return f"[{(low + high) // 2}]"


def _mastermind_codes(game: Any) -> list[tuple[int, ...]]:
    gs = _gs(game)
    digits = range(1, gs["num_numbers"] + 1)
    if gs["duplicate_numbers"]:
        return list(itertools.product(digits, repeat=gs["code_length"]))
    return list(itertools.permutations(digits, gs["code_length"]))


def _mastermind_moves(game: Any) -> list[str]:
    guessed = {tuple(entry["guess"]) for entry in _gs(game)["history"]}
    return ["[" + " ".join(map(str, code)) + "]" for code in _mastermind_codes(game) if code not in guessed]


def _pegs(code: tuple[int, ...], guess: list[int]) -> tuple[int, int]:
    """Mastermind's (black, white) pegs of ``guess`` against ``code``, counted as TextArena counts them."""
    black = sum(a == b for a, b in zip(code, guess))
    common = sum(min(code.count(d), guess.count(d)) for d in set(guess))
    return black, common - black


def _mastermind_expert(game: Any) -> str:
    """The first code (in order) consistent with all feedback so far: cracks 4-of-6 in a handful of guesses."""
    history = _gs(game)["history"]
    guessed = {tuple(entry["guess"]) for entry in history}
    code = next(
        code
        for code in _mastermind_codes(game)
        if code not in guessed and all(_pegs(code, e["guess"]) == (e["black"], e["white"]) for e in history)
    )
    return "[" + " ".join(map(str, code)) + "]"


def _minesweeper_moves(game: Any) -> list[str]:
    return [f"[{r} {c}]" for r in range(game.rows) for c in range(game.cols) if not game.revealed[r][c]]


def _lightsout_moves(game: Any) -> list[str]:
    return [f"[{r} {c}]" for r in range(game.size) for c in range(game.size)]


def _lightsout_expert(game: Any) -> str:
    """A cell of a minimal-press solution, by Gaussian elimination over GF(2) (presses commute and cancel)."""
    n = game.size
    cells = n * n
    rows = []
    for i in range(cells):
        r, c = divmod(i, n)
        mask = 0
        for dr, dc in ((0, 0), (1, 0), (-1, 0), (0, 1), (0, -1)):
            if 0 <= r + dr < n and 0 <= c + dc < n:
                mask |= 1 << ((r + dr) * n + c + dc)
        rows.append([mask, int(_gs(game)["grid"][r][c])])  # row i: which presses toggle cell i, its light
    pivots: list[int] = []
    for col in range(cells):
        pivot = next((i for i in range(len(pivots), cells) if rows[i][0] >> col & 1), None)
        if pivot is None:
            continue
        rows[len(pivots)], rows[pivot] = rows[pivot], rows[len(pivots)]
        for i in range(cells):
            if i != len(pivots) and rows[i][0] >> col & 1:
                rows[i][0] ^= rows[len(pivots)][0]
                rows[i][1] ^= rows[len(pivots)][1]
        pivots.append(col)
    presses = [col for k, col in enumerate(pivots) if rows[k][1]]
    r, c = divmod(presses[0], n) if presses else (0, 0)
    return f"[{r} {c}]"


def _countdown_moves(game: Any) -> list[str]:
    count = len(game.numbers)
    return [
        f"[{i} {j} {op}]"
        for i, j in itertools.permutations(range(count), 2)
        for op in "+-*/"
        if _countdown_result(game.numbers[i], game.numbers[j], op) is not None
    ]


def _countdown_result(a: int, b: int, op: str) -> int | None:
    """Countdown's rule for ``a op b`` (as TextArena's): whole-number division by non-zero, at most 10^6 in size."""
    if op == "/":
        return a // b if b and a % b == 0 else None
    result = {"+": a + b, "-": a - b, "*": a * b}[op]
    return result if abs(result) <= 1_000_000 else None


def _cryptarithm_moves(game: Any) -> list[str]:
    return [
        f"[{letter} {digit}]"
        for letter in sorted(game.letters)
        for digit in range(10)
        if game.digit_used.get(digit, letter) == letter and not (digit == 0 and letter in game.first_letters)
    ]


def _pegjump_moves(game: Any) -> list[str]:
    board = _gs(game)["board"]
    return [f"[{f} {t}]" for f, o, t in game.ALLOWED_MOVES if board[f] and board[o] and not board[t]]


def _pegjump_solvable(board: tuple[bool, ...], moves: tuple[tuple[int, int, int], ...], memo: dict) -> bool:
    if board not in memo:
        if board.count(True) == 1:
            memo[board] = True
        else:
            memo[board] = any(
                _pegjump_solvable(_jump(board, move), moves, memo)
                for move in moves
                if board[move[0]] and board[move[1]] and not board[move[2]]
            )
    return memo[board]


def _jump(board: tuple[bool, ...], move: tuple[int, int, int]) -> tuple[bool, ...]:
    f, o, t = move
    after = list(board)
    after[f] = after[o] = False
    after[t] = True
    return tuple(after)


def _pegjump_expert(game: Any) -> str:
    """A jump that keeps a one-peg finish reachable (depth-first search over the 2^15 boards, memoised)."""
    board, moves = tuple(_gs(game)["board"]), tuple(game.ALLOWED_MOVES)
    memo = game.__dict__.setdefault("_gagpo_solvable", {})
    legal = [m for m in moves if board[m[0]] and board[m[1]] and not board[m[2]]]
    best = next((m for m in legal if _pegjump_solvable(_jump(board, m), moves, memo)), legal[0])
    return f"[{best[0]} {best[2]}]"


def _rushhour_moves(game: Any) -> list[str]:
    return [f"[{vid}{sign}]" for vid in sorted(_gs(game)["vehicles"]) for sign in "+-"]


def _slitherlink_moves(game: Any) -> list[str]:
    horizontal = [f"[h {r} {c}]" for r in range(game.R + 1) for c in range(game.C)]
    vertical = [f"[v {r} {c}]" for r in range(game.R) for c in range(game.C + 1)]
    return horizontal + vertical


def _tictactoe_moves(game: Any) -> list[str]:
    board = _gs(game)["board"]
    return [f"[{3 * r + c}]" for r in range(3) for c in range(3) if board[r][c] == ""]


def _connectfour_moves(game: Any) -> list[str]:
    return [f"[col {c}]" for c in range(game.num_cols) if _gs(game)["board"][0][c] == "."]


def _nim_moves(game: Any) -> list[str]:
    return [f"[{i} {n}]" for i, pile in enumerate(_gs(game)["piles"]) for n in range(1, pile + 1)]


def _nim_expert(game: Any) -> str:
    """Leave a zero nim-sum where possible (the winning strategy when the last to take wins); else take one."""
    piles = _gs(game)["piles"]
    total = 0
    for pile in piles:
        total ^= pile
    for i, pile in enumerate(piles):
        if total and pile ^ total < pile:
            return f"[{i} {pile - (pile ^ total)}]"
    return f"[{next(i for i, pile in enumerate(piles) if pile)} 1]"


def _kuhn_moves(game: Any) -> list[str]:
    tree = _gs(game)["current_legal_action_tree"]
    return [f"[{move.capitalize()}]" for move in tree] if isinstance(tree, dict) else []


def _fifteen_repair(game: Any) -> None:
    """FifteenPuzzle calls ``set_winners`` (a multi-player method) on its single-player state when solved."""

    def set_winners(state: Any, player_ids: list[int], reason: str) -> None:
        state.set_outcome(reward=1.0, reason=reason)

    game.state.set_winners = types.MethodType(set_winners, game.state)  # bound: copies of the game rebind it


def _without(*names: str) -> Callable[[Any], dict[str, Any]]:
    """The game state less ``names`` (text renderings of the rest, counters that change nothing)."""
    return lambda game: {k: v for k, v in _gs(game).items() if k not in names}


def _attrs(*names: str) -> Callable[[Any], dict[str, Any]]:
    """Attributes of the game object, for games that keep their state outside ``state.game_state``."""
    return lambda game: {name: getattr(game, name) for name in names}


@dataclass(frozen=True)
class Game:
    """One TextArena game as a gagpo_gym env: what :class:`TextArenaEnv` needs to know about it."""

    #: TextArena's registry id; its entry point and default settings build the raw game.
    ta_id: str
    #: The legal moves of the player to move, in the game's spelling.
    moves: Callable[[Any], list[str]]
    #: The true state the key hashes (default: the whole ``state.game_state``).
    state: Callable[[Any], Any] = _gs
    #: Settings over TextArena's defaults.
    kwargs: dict[str, Any] = field(default_factory=dict)
    players: int = 1
    #: Whether :meth:`moves` may list moves the game still rejects: then each is tried on a copy first.
    probe: bool = False
    #: Whether TextArena's turn limit is lifted (``state.max_turns`` made infinite) after reset.
    lift_turn_limit: bool = True
    #: Whether a listed move that TextArena rejects ends the game as a loss (Minesweeper reports a mine that way).
    rejected_listed_move_loses: bool = False
    #: A repair of a TextArena bug, applied to the game after each reset.
    repair: Callable[[Any], None] | None = None
    #: An exact expert: the game -> its move.
    expert: Callable[[Any], str] | None = None


GAMES: dict[str, Game] = {
    "TowerOfHanoi": Game("TowerOfHanoi-v0", _hanoi_moves, expert=_hanoi_expert),
    "FrozenLake": Game("FrozenLake-v0", _frozenlake_moves, state=_without(), expert=_frozenlake_expert),
    "GuessTheNumber": Game("GuessTheNumber-v0", _guess_moves, expert=_guess_expert),
    "Mastermind": Game("Mastermind-v0", _mastermind_moves, expert=_mastermind_expert),
    "Minesweeper": Game(
        "Minesweeper-v0-small",
        _minesweeper_moves,
        state=_attrs("grid", "revealed", "first_move"),
        rejected_listed_move_loses=True,
    ),
    "LightsOut": Game("LightsOut-v0", _lightsout_moves, lift_turn_limit=False, expert=_lightsout_expert),
    "2048": Game("2048-v0-super-easy", lambda game: list(("[Up]", "[Down]", "[Left]", "[Right]")), probe=True),
    "Blackjack": Game("Blackjack-v0", lambda game: ["[Hit]", "[Stand]"], kwargs={"num_hands": 1}),
    "FifteenPuzzle": Game(
        "FifteenPuzzle-v0",
        lambda game: list(_DIRECTIONS),
        state=_without("rendered_board"),
        probe=True,
        repair=_fifteen_repair,
    ),
    "Sokoban": Game("Sokoban-v0", lambda game: list(_DIRECTIONS), state=_attrs("room_state"), probe=True),
    "Countdown": Game("Countdown-v0", _countdown_moves, state=_attrs("numbers", "target", "best_value")),
    "Cryptarithm": Game("Cryptarithm-v0", _cryptarithm_moves, state=_attrs("mapping")),
    "Secretary": Game("Secretary-v0", lambda game: ["[accept]", "[continue]"]),
    "ThreeCardMonte": Game(
        "ThreeCardMonte-v0", lambda game: [f"[{k}]" for k in range(game.num_cups)], state=_attrs("ball_pos")
    ),
    "RushHour": Game("RushHour-v0", _rushhour_moves, probe=True),
    "PegJump": Game("PegJump-v0", _pegjump_moves, expert=_pegjump_expert),
    "Slitherlink": Game("Slitherlink-v0", _slitherlink_moves, state=_attrs("clues", "h_edges", "v_edges")),
    "TicTacToe": Game("TicTacToe-v0", _tictactoe_moves, players=2),
    "ConnectFour": Game("ConnectFour-v0", _connectfour_moves, players=2),
    "Nim": Game("Nim-v0", _nim_moves, players=2, expert=_nim_expert),
    "KuhnPoker": Game("KuhnPoker-v0", _kuhn_moves, players=2),
}


def _build(game: Game) -> Any:
    """The raw TextArena game (TextArena's entry point and default settings, ours over them), no wrappers."""
    from textarena.envs.registration import ENV_REGISTRY

    spec = ENV_REGISTRY[game.ta_id]
    module, name = spec.entry_point.split(":")
    return getattr(importlib.import_module(module), name)(**{**spec.kwargs, **game.kwargs})


#: How many freshly reset games (with their random streams) the process keeps, by (game, seed): a rollout group
#: resets one seed once per member, and some games take a second to generate (RushHour, Sokoban).
FRESH_CACHE_SIZE = 256
FRESH_CACHE: OrderedDict[tuple[str, int], tuple[Any, Any]] = OrderedDict()


class TextArenaEnv(TextEnv):
    """One TextArena game behind the text-env contract (module docstring); ``game`` names a row of :data:`GAMES`."""

    metadata: dict[str, Any] = {"render_modes": ["ansi", "human"]}
    invalid_feedback = "That is not a legal move here; nothing changed."

    def __init__(
        self,
        game: str,
        invalid_move: str = "penalty",
        opponent: str | Opponent = "random",
        learner: str = "first",
        render_mode: str | None = None,
    ) -> None:
        if game not in GAMES:
            raise ValueError(f"game must be one of {sorted(GAMES)}, got {game!r}")
        if invalid_move not in INVALID_MOVES:
            raise ValueError(f"invalid_move must be one of {INVALID_MOVES}, got {invalid_move!r}")
        if not (opponent == "random" or callable(opponent)):
            raise ValueError(
                f"opponent must be 'random' or a callable (observation, legal_moves) -> move, got {opponent!r}"
            )
        if learner not in SIDES:
            raise ValueError(f"learner must be one of {SIDES}, got {learner!r}")
        if importlib.util.find_spec("textarena") is None:
            raise ImportError(f"{GAGPO_TEXTARENA_PREFIX}{game}-v0 needs TextArena, an optional extra: {INSTALL_HINT}")
        super().__init__(render_mode=render_mode)
        self.name, self.game = game, GAMES[game]
        self.invalid_move, self.opponent, self.learner = invalid_move, opponent, learner
        self.EXPERTS = ("oracle",) if self.game.expert is not None else ()
        self.ta_game: Any = None
        self._rng = random.Random(0)
        self.learner_id = 0
        self.score: float | None = None
        self.printed = io.StringIO()

    # ----- calls into TextArena ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def _in_game(self) -> Iterator[None]:
        """Run TextArena on this env's own ``random`` stream, its prints going to :attr:`printed`."""
        outer = random.getstate()
        random.setstate(self._rng.getstate())
        try:
            with contextlib.redirect_stdout(self.printed):
                yield
        finally:
            self._rng.setstate(random.getstate())
            random.setstate(outer)
            self.printed.seek(0)
            self.printed.truncate()

    def _messages(self) -> str:
        """The new text the learner has been sent (its own moves left out: the prompt wrappers keep those)."""
        from textarena import GAME_ID

        lines = []
        for sender, message, _ in self.ta_game.state.observations[self.learner_id]:
            if sender == GAME_ID:
                lines.append(message)
            elif sender != self.learner_id:
                lines.append(f"[Opponent] {message}")
        self.ta_game.state.observations[self.learner_id] = []
        return "\n".join(line.strip() for line in lines if line.strip())

    def _rejected(self, errors_before: int) -> bool:
        """Whether the last TextArena step flagged the mover's move invalid (a warning, or the end it causes)."""
        state = self.ta_game.state
        return state.error_count > errors_before or any(info.get("invalid_move") for info in state.game_info.values())

    def _play(self, move: str) -> bool:
        """One move by the player to move; returns whether TextArena rejected it."""
        state = self.ta_game.state
        errors_before = state.error_count
        with self._in_game():
            self.ta_game.step(move)
        return self._rejected(errors_before)

    def _opponents_turns(self) -> None:
        """The opponent moves until it is the learner's turn or the game is over."""
        while (
            self.game.players == 2
            and not self.ta_game.state.done
            and self.ta_game.state.current_player_id != self.learner_id
        ):
            mover = self.ta_game.state.current_player_id
            legal = self.game.moves(self.ta_game)
            if self.opponent == "random":
                move = legal[self._rng.randrange(len(legal))]
            else:
                text = "\n".join(m for _, m, _ in self.ta_game.state.observations[mover])
                reply = self.opponent(text, list(legal))
                move = match_command(reply, legal)
                if move is None:
                    raise ValueError(f"the opponent's reply {reply!r} is not one of its legal moves {legal}")
            self.ta_game.state.observations[mover] = []
            self._play(move)

    # ----- TextEnv API ------------------------------------------------------------------------------------
    def _new_task(self, seed: int | None, options: dict[str, Any]) -> str:
        task_seed = int(seed) if seed is not None else int(self.np_random.integers(2**31))
        self.won, self.score = False, None
        fresh = FRESH_CACHE.get((self.name, task_seed))
        if fresh is None:
            self._rng = random.Random(task_seed)
            with self._in_game():
                game = _build(self.game)
                game.reset(num_players=self.game.players, seed=task_seed)
            fresh = FRESH_CACHE[(self.name, task_seed)] = (game, self._rng.getstate())
            while len(FRESH_CACHE) > FRESH_CACHE_SIZE:
                FRESH_CACHE.popitem(last=False)
        self.ta_game = copy.deepcopy(fresh[0])
        self._rng.setstate(fresh[1])
        state = self.ta_game.state
        if self.game.repair is not None:
            self.game.repair(self.ta_game)
        if self.game.lift_turn_limit:
            state.max_turns = math.inf
        if self.invalid_move == "penalty":
            state.error_allowance = 1  # one warning at a time: the adapter restores the game after each
        side = self.learner if self.learner != "random" else SIDES[self._rng.randrange(2)]
        self.learner_id = 0 if side == "first" or self.game.players == 1 else 1
        prompt = next(m for _, m, kind in state.observations[self.learner_id] if kind.name == "PROMPT")
        self.task = to_charset(prompt.strip())
        self.task_id = f"textarena-{self.name}-{task_seed}"
        self._opponents_turns()
        return self._messages()

    def admissible_actions(self) -> list[str]:
        if self.ta_game.state.done:
            return [GAME_OVER_MOVE]
        moves = self.game.moves(self.ta_game)
        if self.game.probe:
            moves = [move for move in moves if self._legal_on_copy(move)]
        return moves

    def _legal_on_copy(self, move: str) -> bool:
        """Whether the game accepts ``move`` (tried on a copy, on a copy of the stream: nothing here changes)."""
        real, stream = self.ta_game, self._rng.getstate()
        self.ta_game = copy.deepcopy(real)
        try:
            return not self._play(move)
        finally:
            self.ta_game = real
            self._rng.setstate(stream)

    def state_string(self) -> str:
        state = self.ta_game.state
        return canonical_state(
            {
                "game": self.name,
                "state": self.game.state(self.ta_game),
                "to_move": state.current_player_id if self.game.players == 2 else 0,
                "learner": self.learner_id,
                "done": bool(state.done),
            }
        )

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if self.ta_game.state.done:  # only ``pass`` after the end, which changes nothing
            valid = match_command(action, [GAME_OVER_MOVE]) is not None
            return "The game is over.", 0.0, True, False, self._info(action_valid=valid)
        command = self.canonical_action(action) if self.action_space.contains(action) else None
        if command is None and (self.invalid_move == "penalty" or not self.action_space.contains(action)):
            return to_charset(self.invalid_feedback), 0.0, False, False, self._info(action_valid=False)
        before = (copy.deepcopy(self.ta_game), self._rng.getstate()) if self.invalid_move == "penalty" else None
        rejected = self._play(command if command is not None else action)
        if rejected and self.game.rejected_listed_move_loses and command is not None:
            self.ta_game.state.set_outcome(reward=0.0, reason="You revealed a mine.")
            rejected = False  # a legal move that loses
        elif rejected and before is not None:
            observation = self._messages()
            self.ta_game, stream = before
            self._rng.setstate(stream)
            self._last_observation = to_charset(observation or self.invalid_feedback)
            return self._last_observation, 0.0, False, False, self._info(action_valid=False)
        if not rejected:
            self._opponents_turns()
        self._last_observation = to_charset(self._messages())
        terminated = bool(self.ta_game.state.done)
        if terminated:
            self._settle()
        return self._last_observation, float(self.won), terminated, False, self._info(action_valid=not rejected)

    def _settle(self) -> None:
        """Read the outcome at the end: ``won`` from TextArena's reward, partial credit as ``score``."""
        rewards = self.ta_game.state.rewards or {}
        reward = float(rewards.get(self.learner_id, 0.0))
        self.won = reward >= 1.0
        if self.game.players == 1 and 0.0 <= reward <= 1.0:
            self.score = reward

    def expert_action(self, kind: str | None = None) -> str:
        self._expert_kind(kind)
        assert self.game.expert is not None  # _expert_kind raised otherwise: EXPERTS is empty
        if self.ta_game.state.done:
            return GAME_OVER_MOVE
        return self.game.expert(self.ta_game)

    def _info(self, **extra: Any) -> dict[str, Any]:
        info = super()._info(**extra)
        if self.score is not None:
            info["score"] = self.score
        return info
