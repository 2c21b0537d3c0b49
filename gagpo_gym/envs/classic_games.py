"""PettingZoo's tic-tac-toe and Connect Four as single-agent text envs against an opponent policy.

The game itself (legality, turn order, win detection, rewards) is PettingZoo's AEC env,
``pettingzoo.make("aec", "classic/tictactoe-v3")`` or ``"classic/connect_four-v3"`` (extra
``gagpo-gym[pettingzoo]``). The learner plays one side; after each of its moves the opponent answers at once,
so every observation shows the learner to move.

* ``opponent``: ``"random"`` (uniform legal move), ``"heuristic"`` (win if it can, else block the learner's
  immediate win, else random) and, for tic-tac-toe, ``"minimax"`` (perfect play, random among equally good
  moves). The opponent draws from the env's ``np_random``, seeded by ``reset(seed=...)``.
* ``learner``: ``"first"`` (plays X), ``"second"`` (plays O) or ``"random"`` (drawn per task).
* Commands: tic-tac-toe ``place N`` with cells numbered 1-9 left to right, top to bottom; Connect Four
  ``drop N`` with columns 1-7 from the left. Admissible = legal moves. After the game ends the only admissible
  command is ``pass``, which changes nothing (the contract wants a non-empty list).
* Reward: 1 for a win, 0 for a draw or a loss (the contract's success reward is 1 and ``won`` means the
  learner won). ``info["outcome"]`` tells ``"playing"``, ``"win"``, ``"draw"`` or ``"loss"`` apart.
* Key: the board, whose turn it is and which side the learner plays.
* Expert: tic-tac-toe, minimax (never loses) breaking ties toward the best winning chances against a random
  opponent; Connect Four, a depth-limited alpha-beta search.

PettingZoo's tic-tac-toe stores the board column by column: ``squares[i]`` is column ``i // 3``, row
``i % 3`` (see ``pettingzoo.classic.tictactoe.board.Board``'s comment and the env's ``render``). Cell ``N``
of our text is row ``(N - 1) // 3``, column ``(N - 1) % 3``, i.e. ``squares[3 * column + row]``.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from gagpo_gym.core import TextEnv

SIDES = ("first", "second", "random")
MARKS = {0: ".", 1: "X", 2: "O"}
OUTCOMES = {1: "win", 0: "draw", -1: "loss"}


def _make_pettingzoo_game(name: str) -> Any:
    """``pettingzoo.make("aec", name)``, imported lazily, with a readable error when the extra is missing."""
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")  # pettingzoo's classic games import pygame
    try:
        import pettingzoo
    except ImportError as error:
        raise ImportError(
            "the tic-tac-toe and Connect Four envs need PettingZoo: pip install gagpo-gym[pettingzoo]"
        ) from error
    return pettingzoo.make("aec", name)


class _TwoPlayerGameEnv(TextEnv):
    """A two-player PettingZoo AEC game seen by one player; subclasses supply the game's rules in text."""

    #: The kinds of :meth:`expert_action`: one, a game-tree search.
    EXPERTS = ("oracle",)

    game_name: str = ""
    slug: str = ""
    command_verb: str = ""
    opponents: tuple[str, ...] = ("random", "heuristic")

    def __init__(self, opponent: str = "random", learner: str = "random", render_mode: str | None = None) -> None:
        if opponent not in self.opponents:
            raise ValueError(f"opponent must be one of {self.opponents}, got {opponent!r}")
        if learner not in SIDES:
            raise ValueError(f"learner must be one of {SIDES}, got {learner!r}")
        super().__init__(render_mode=render_mode)
        self.opponent, self.learner = opponent, learner
        self.game = self._make_game()
        self.learner_mark = 1
        self.outcome = "playing"
        self._last_opponent_move: int | None = None

    # ----- game-specific hooks ------------------------------------------------------------------------
    def _make_game(self) -> Any:
        raise NotImplementedError

    def board(self) -> tuple[int, ...]:
        """The board in our cell order: 0 empty, 1 first player (X), 2 second player (O)."""
        raise NotImplementedError

    def _engine_move(self, move: int) -> int:
        """PettingZoo's action index for our move number."""
        raise NotImplementedError

    def legal_moves(self, board: tuple[int, ...]) -> list[int]:
        raise NotImplementedError

    def wins_with(self, board: tuple[int, ...], move: int, mark: int) -> bool:
        """Whether ``mark`` playing ``move`` on ``board`` completes a line."""
        raise NotImplementedError

    def board_text(self) -> str:
        raise NotImplementedError

    def _search_move(self) -> int:
        raise NotImplementedError

    def _perfect_moves(self, board: tuple[int, ...], mark: int) -> list[int]:
        """The moves of perfect play, for the ``"minimax"`` opponent (games small enough to solve)."""
        raise NotImplementedError

    # ----- opponent -----------------------------------------------------------------------------------
    def _opponent_move(self) -> int:
        board, mark = self.board(), 3 - self.learner_mark
        legal = self.legal_moves(board)
        if self.opponent == "heuristic":
            for who in (mark, self.learner_mark):  # win if it can, else block
                for move in legal:
                    if self.wins_with(board, move, who):
                        return move
        if self.opponent == "minimax":
            legal = self._perfect_moves(board, mark)
        return legal[int(self.np_random.integers(len(legal)))]

    # ----- TextEnv API --------------------------------------------------------------------------------
    def _new_task(self, seed: int | None, options: dict[str, Any]) -> str:
        side = self.learner if self.learner != "random" else SIDES[int(self.np_random.integers(2))]
        self.learner_mark = 1 if side == "first" else 2
        self.game.reset()
        self.outcome = "playing"
        self._last_opponent_move = None
        if side == "second":
            self._play(self._opponent_move(), learner=False)
        you, them = MARKS[self.learner_mark], MARKS[3 - self.learner_mark]
        order = "you move first" if side == "first" else "the opponent moves first"
        self.task = f"Win a game of {self.game_name} playing {you} ({order}) against {them}."
        self.task_id = f"{self.slug}-{side}-vs-{self.opponent}"
        return f"{self.task} {self._rules()}\n{self._situation()}"

    def _play(self, move: int, learner: bool) -> None:
        """Play one move in the PettingZoo game; record the outcome when the game ends."""
        agent = self.game.agent_selection
        self.game.step(self._engine_move(move))
        if not learner:
            self._last_opponent_move = move
        if any(self.game.terminations.values()):
            reward = self.game.rewards[agent] if learner else -self.game.rewards[agent]
            self.outcome = OUTCOMES[int(reward)]
            self.won = self.outcome == "win"

    def _execute(self, command: str) -> tuple[str, float, bool]:
        if self.outcome != "playing":  # ``pass`` after the end
            return self._situation(), 0.0, True
        self._last_opponent_move = None
        self._play(int(command.split()[1]), learner=True)
        if self.outcome == "playing":
            self._play(self._opponent_move(), learner=False)
        return self._situation(), float(self.won), self.outcome != "playing"

    def admissible_actions(self) -> list[str]:
        if self.outcome != "playing":
            return ["pass"]
        return [f"{self.command_verb} {move}" for move in self.legal_moves(self.board())]

    def state_string(self) -> str:
        board = "".join(str(v) for v in self.board())
        to_move = 1 + sum(1 for v in self.board() if v) % 2
        return f"{self.game_name}|learner={self.learner_mark}|{board}|to_move={to_move}"

    def expert_action(self, kind: str | None = None) -> str:
        self._expert_kind(kind)
        if self.outcome != "playing":
            return "pass"
        return f"{self.command_verb} {self._search_move()}"

    def _info(self, **extra: Any) -> dict[str, Any]:
        info = super()._info(**extra)
        info["outcome"] = self.outcome
        return info

    # ----- text ---------------------------------------------------------------------------------------
    def _rules(self) -> str:
        raise NotImplementedError

    def _situation(self) -> str:
        them = MARKS[3 - self.learner_mark]
        lines = [self.board_text()]
        if self._last_opponent_move is not None:
            lines.insert(0, f"The opponent ({them}) played {self.command_verb} {self._last_opponent_move}.")
        if self.outcome == "playing":
            lines.append(f"You play {MARKS[self.learner_mark]}. Your move: {self.command_verb} <number>.")
        else:
            lines.append({"win": "You win!", "draw": "The game is a draw.", "loss": "You lose."}[self.outcome])
        return "\n".join(lines)


# ----- tic-tac-toe --------------------------------------------------------------------------------------
TTT_LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))


def ttt_winner(board: tuple[int, ...]) -> int:
    for a, b, c in TTT_LINES:
        if board[a] and board[a] == board[b] == board[c]:
            return board[a]
    return 0


def _ttt_child_value(board: tuple[int, ...], move: int, mark: int) -> int:
    """Minimax value for ``mark`` of playing ``move`` (0-based): +(1 + empty cells) for a win, so faster wins
    score higher, 0 for a draw, negative for a loss."""
    child = board[:move] + (mark,) + board[move + 1 :]
    if ttt_winner(child) == mark:
        return 1 + child.count(0)
    return 0 if 0 not in child else -_ttt_value(child, 3 - mark)


@functools.cache
def _ttt_value(board: tuple[int, ...], mark: int) -> int:
    """Minimax value of ``board`` for ``mark`` to move."""
    return max(_ttt_child_value(board, i, mark) for i in range(9) if not board[i])


@functools.cache
def _ttt_best_moves(board: tuple[int, ...], mark: int) -> tuple[int, ...]:
    """Moves (0-based cells) whose minimax outcome (win, draw or loss) is the best available."""
    legal = [i for i in range(9) if not board[i]]
    values = {i: _ttt_child_value(board, i, mark) for i in legal}
    sign = {i: (v > 0) - (v < 0) for i, v in values.items()}
    top = max(sign.values())
    return tuple(i for i in legal if sign[i] == top)


@functools.cache
def _ttt_expert(board: tuple[int, ...], mark: int) -> tuple[int, float]:
    """(move, win probability against a uniformly random opponent) among the minimax-optimal moves."""
    best_move, best_p = -1, -1.0
    for move in _ttt_best_moves(board, mark):
        child = board[:move] + (mark,) + board[move + 1 :]
        if ttt_winner(child) == mark:
            p = 1.0
        elif 0 not in child:
            p = 0.0
        else:
            replies = [i for i in range(9) if not child[i]]
            total = 0.0
            for reply in replies:
                grand = child[:reply] + (3 - mark,) + child[reply + 1 :]
                if ttt_winner(grand) == 0 and 0 in grand:
                    total += _ttt_expert(grand, mark)[1]
            p = total / len(replies)
        if p > best_p:
            best_move, best_p = move, p
    return best_move, best_p


class TicTacToeEnv(_TwoPlayerGameEnv):
    """Tic-tac-toe against an opponent policy (``gagpo_gym/TicTacToe-v0``)."""

    game_name = "tic-tac-toe"
    slug = "tictactoe"
    command_verb = "place"
    opponents = ("random", "heuristic", "minimax")

    def _make_game(self) -> Any:
        return _make_pettingzoo_game("classic/tictactoe-v3")

    def board(self) -> tuple[int, ...]:
        squares = self.game.unwrapped.board.squares
        return tuple(squares[3 * (i % 3) + i // 3] for i in range(9))

    def _engine_move(self, move: int) -> int:
        row, col = divmod(move - 1, 3)
        return 3 * col + row

    def legal_moves(self, board: tuple[int, ...]) -> list[int]:
        return [i + 1 for i in range(9) if not board[i]]

    def wins_with(self, board: tuple[int, ...], move: int, mark: int) -> bool:
        return ttt_winner(board[: move - 1] + (mark,) + board[move:]) == mark

    def _search_move(self) -> int:
        return _ttt_expert(self.board(), self.learner_mark)[0] + 1

    def _perfect_moves(self, board: tuple[int, ...], mark: int) -> list[int]:
        return [i + 1 for i in _ttt_best_moves(board, mark)]

    def _rules(self) -> str:
        return "Three in a row (across, down or diagonal) wins. Empty cells show their numbers."

    def board_text(self) -> str:
        board = self.board()
        cells = [MARKS[v] if v else str(i + 1) for i, v in enumerate(board)]
        rows = [f" {cells[r]} | {cells[r + 1]} | {cells[r + 2]}" for r in (0, 3, 6)]
        return "\n---+---+---\n".join(rows)


# ----- Connect Four -------------------------------------------------------------------------------------
C4_ROWS, C4_COLS = 6, 7
C4_ORDER = (3, 2, 4, 1, 5, 0, 6)  # search the centre first: better pruning and a centre-first tie-break
#: Number of four-in-a-row windows through each cell (row 0 at the bottom): a classic positional weight.
C4_WEIGHTS = (
    (3, 4, 5, 7, 5, 4, 3),
    (4, 6, 8, 10, 8, 6, 4),
    (5, 8, 11, 13, 11, 8, 5),
    (5, 8, 11, 13, 11, 8, 5),
    (4, 6, 8, 10, 8, 6, 4),
    (3, 4, 5, 7, 5, 4, 3),
)
C4_WIN = 10_000


def _c4_four(bits: int) -> bool:
    """Four in a row in a bitboard (bit ``7 * column + height``; one spare bit per column stops wrapping)."""
    for shift in (1, 7, 6, 8):
        pairs = bits & (bits >> shift)
        if pairs & (pairs >> (2 * shift)):
            return True
    return False


def _c4_negamax(me: int, them: int, heights: list[int], depth: int, alpha: int, beta: int, material: int) -> int:
    """Alpha-beta score for the player to move: a win is worth ``C4_WIN`` plus the depth left (faster is
    better); leaves are scored by positional weights."""
    moves = [c for c in C4_ORDER if heights[c] < C4_ROWS]
    if not moves:
        return 0
    for c in moves:
        if _c4_four(me | 1 << (7 * c + heights[c])):
            return C4_WIN + depth
    if depth == 1:
        return material + max(C4_WEIGHTS[heights[c]][c] for c in moves)
    best = -(C4_WIN * 2)
    for c in moves:
        h = heights[c]
        heights[c] = h + 1
        score = -_c4_negamax(
            them, me | 1 << (7 * c + h), heights, depth - 1, -beta, -alpha, -(material + C4_WEIGHTS[h][c])
        )
        heights[c] = h
        if score > best:
            best = score
        alpha = max(alpha, score)
        if alpha >= beta:
            break
    return best


class ConnectFourEnv(_TwoPlayerGameEnv):
    """Connect Four against an opponent policy (``gagpo_gym/ConnectFour-v0``)."""

    game_name = "Connect Four"
    slug = "connectfour"
    command_verb = "drop"

    def __init__(
        self,
        opponent: str = "random",
        learner: str = "random",
        search_depth: int = 4,
        render_mode: str | None = None,
    ) -> None:
        if not isinstance(search_depth, int) or not 1 <= search_depth <= 8:
            raise ValueError(f"search_depth must be an int in [1, 8], got {search_depth!r}")
        self.search_depth = search_depth
        super().__init__(opponent=opponent, learner=learner, render_mode=render_mode)

    def _make_game(self) -> Any:
        return _make_pettingzoo_game("classic/connect_four-v3")

    def board(self) -> tuple[int, ...]:
        """PettingZoo's own layout: ``board[7 * row + column]``, row 0 at the top."""
        return tuple(self.game.unwrapped.board)

    def _engine_move(self, move: int) -> int:
        return move - 1

    def legal_moves(self, board: tuple[int, ...]) -> list[int]:
        return [c + 1 for c in range(C4_COLS) if board[c] == 0]

    @staticmethod
    def _bitboards(board: tuple[int, ...]) -> tuple[dict[int, int], list[int]]:
        bits, heights = {1: 0, 2: 0}, [0] * C4_COLS
        for c in range(C4_COLS):
            for height in range(C4_ROWS):
                value = board[C4_COLS * (C4_ROWS - 1 - height) + c]
                if not value:
                    break
                bits[value] |= 1 << (7 * c + height)
                heights[c] = height + 1
        return bits, heights

    def wins_with(self, board: tuple[int, ...], move: int, mark: int) -> bool:
        bits, heights = self._bitboards(board)
        c = move - 1
        return _c4_four(bits[mark] | 1 << (7 * c + heights[c]))

    def _search_move(self) -> int:
        """Best column by alpha-beta search ``search_depth`` plies deep (centre first on ties)."""
        bits, heights = self._bitboards(self.board())
        me, them = bits[self.learner_mark], bits[3 - self.learner_mark]
        material = sum(
            C4_WEIGHTS[h][c] * ((me >> (7 * c + h) & 1) - (them >> (7 * c + h) & 1))
            for c in range(C4_COLS)
            for h in range(C4_ROWS)
        )
        best_move, best_score = -1, -(C4_WIN * 3)
        for c in C4_ORDER:
            h = heights[c]
            if h == C4_ROWS:
                continue
            mine = me | 1 << (7 * c + h)
            if _c4_four(mine):
                return c + 1
            after = material + C4_WEIGHTS[h][c]
            if self.search_depth == 1:
                score = after
            else:
                heights[c] = h + 1
                score = -_c4_negamax(them, mine, heights, self.search_depth - 1, -(C4_WIN * 3), -best_score, -after)
                heights[c] = h
            if score > best_score:
                best_move, best_score = c + 1, score
        return best_move

    def _rules(self) -> str:
        return "Drop pieces into columns 1-7; four in a row (across, down or diagonal) wins."

    def board_text(self) -> str:
        board = self.board()
        rows = ["|" + " ".join(MARKS[board[C4_COLS * r + c]] for c in range(C4_COLS)) + "|" for r in range(C4_ROWS)]
        return "\n".join([" " + " ".join(str(c + 1) for c in range(C4_COLS))] + rows)
