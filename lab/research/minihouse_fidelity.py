"""How MiniHouse's houses differ from ALFWorld's real games: the same statistics measured on both.

    python -m lab.research.minihouse_fidelity --splits valid_seen valid_unseen --houses 500 --out results/sim2real

ALFWorld's side is read from the real engine: each game's initial PDDL facts (receptacles, their locations and
doors, where every object is), its ``traj_data.json`` task parameters, and the observations of its walkthrough
replayed on the engine. MiniHouse's side comes from the generator (``size="full"`` houses, tasks 0..N-1) and
from an oracle and a random episode on each. A difference that a policy trained in MiniHouse never sees is a
transfer gap:

* receptacles per room, objects, and the share of receptacles with doors (search length);
* receptacles sharing one location (ALFWorld: "go to" one of them makes the others reachable too);
* objects standing outside every receptacle (floor lamps, objects on the floor);
* where the goal objects start: how many receptacles could hold them, how many of those are behind a door;
* the lamp of ``look`` tasks (desk or floor lamp);
* object and receptacle types of the games that MiniHouse never generates;
* observation phrasing: the share of the walkthroughs' observations whose template (names and numbers replaced)
  MiniHouse ever produces.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np

import gagpo_gym  # noqa: F401  (registers the envs)
from gagpo_gym.envs.minihouse import vocab

_FACT = re.compile(r"^(\w+)\((.*)\)$")
_ENTITY = re.compile(r"\b([a-z]+) \d+\b")
_LIST = re.compile(r"(?:a )?<e>(?:,? (?:and )?(?:a )?<e>)*")


def template(observation: str) -> str:
    """The phrasing of an observation: every "name N", or list of them ("a apple 1, and a cup 2"), becomes <e>."""
    return _LIST.sub("<e>", _ENTITY.sub("<e>", observation.strip().lower()))


def parse_facts(state: str) -> dict[str, list[tuple[str, ...]]]:
    """PDDL facts ``name(arg: type, ...)`` grouped by name, arguments without their types."""
    facts: dict[str, list[tuple[str, ...]]] = defaultdict(list)
    for line in state.splitlines():
        match = _FACT.match(line.strip())
        if match:
            facts[match.group(1)].append(tuple(a.rsplit(":", 1)[0].strip() for a in match.group(2).split(", ")))
    return facts


def _kind(pddl_type: str) -> str:
    """``"alarmclocktype"`` -> ``"alarmclock"``: the lower-case type name that the observations use."""
    return pddl_type.removesuffix("type")


def alfworld_games(split: str, n_games: int | None = None) -> tuple[list[dict[str, Any]], Counter]:
    """Per game of ``split`` (the first ``n_games`` in the env's order; all by default): the statistics of its
    initial state; and its walkthrough observations' templates."""
    import gymnasium as gym

    env = gym.make("gagpo_gym/ALFWorld-v0", split=split).unwrapped
    known_objects = {t.lower() for objects in vocab.ROOM_OBJECTS.values() for t in objects} | {vocab.LAMP.lower()}
    known_receptacles = {t.lower() for t in vocab.CAN_CONTAIN}
    rows, phrasing = [], Counter()
    try:
        for seed in range(min(len(env.games), n_games or len(env.games))):
            env.reset(seed=seed)
            facts = parse_facts(env.state_string())
            game_dir = Path(env.game_file).parent
            params = json.loads((game_dir / "traj_data.json").read_text())["pddl_params"]
            rec_type = {r: _kind(t) for r, t in facts["receptacletype"]}
            obj_type = {o: _kind(t) for o, t in facts["objecttype"]}
            movable = ({o for (o,) in facts["pickupable"]} | {o for (o,) in facts["toggleable"]}) & obj_type.keys()
            inside = {o: r for o, r in facts["inreceptacle"] if o in obj_type}
            doors = {r for (r,) in facts["openable"]}
            at = Counter(loc for _, loc in facts["receptacleatlocation"])
            shared = [r for r, loc in facts["receptacleatlocation"] if at[loc] > 1]
            goal = params["object_target"].lower()
            can_hold = {_kind(r) for r, o in facts["cancontain"] if _kind(o) == goal}
            targets = [o for o, t in obj_type.items() if t == goal]
            rows.append(
                {
                    "type": env.task_type,
                    "receptacles": len(rec_type),
                    "objects": len(movable),
                    "door_share": len(doors) / max(1, len(rec_type)),
                    "shared_location_share": len(shared) / max(1, len(rec_type)),
                    "off_receptacle": sum(o not in inside for o in movable),
                    "targets": len(targets),
                    "search_width": sum(t in can_hold for t in rec_type.values()),
                    "targets_behind_door": np.mean([inside.get(o) in doors for o in targets]) if targets else 0.0,
                    "objects_behind_door": np.mean([inside.get(o) in doors for o in movable]),
                    "floor_lamp": params["toggle_target"] == "FloorLamp",
                    "unknown_goal_object": goal not in known_objects,
                    "unknown_goal_receptacle": bool(params["parent_target"])
                    and params["parent_target"].lower() not in known_receptacles,
                    "unknown_receptacle_types": sorted(set(rec_type.values()) - known_receptacles),
                    "unknown_object_types": sorted({obj_type[o] for o in movable} - known_objects),
                }
            )
            for command in json.loads((game_dir / "game.tw-pddl").read_text())["walkthrough"]:
                observation, *_ = env.step(command)
                phrasing[template(observation)] += 1
    finally:
        env.close()
    return rows, phrasing


def minihouse_houses(n: int, env_kwargs: dict[str, Any]) -> tuple[list[dict[str, Any]], Counter]:
    """The same statistics for MiniHouse's tasks 0..n-1 (full-size unless ``env_kwargs`` say otherwise), and the
    phrasing of an oracle and a random episode on each."""
    import gymnasium as gym

    env = gym.make("gagpo_gym/MiniHouse-v0", **{"size": "full", **env_kwargs})
    rng = np.random.default_rng(0)
    rows, phrasing = [], Counter()
    for seed in range(n):
        env.reset(seed=seed)
        h = env.unwrapped.house
        targets = h.targets
        rows.append(
            {
                "type": h.task_type,
                "receptacles": len(h.rec_type),
                "objects": len(h.obj_type),
                "door_share": float(np.mean(h.rec_openable)),
                "shared_location_share": 0.0,  # one location per receptacle, by construction
                "off_receptacle": 0,  # every object starts in a receptacle, by construction
                "targets": len(targets),
                "search_width": sum(h.goal_object in vocab.CAN_CONTAIN[t] for t in h.rec_type),
                "targets_behind_door": float(np.mean([h.rec_openable[h.location[o]] for o in targets])),
                "objects_behind_door": float(np.mean([h.rec_openable[r] for r in h.location])),
                "floor_lamp": False,
                "unknown_goal_object": False,
                "unknown_goal_receptacle": False,
                "unknown_receptacle_types": [],
                "unknown_object_types": [],
            }
        )
        for explore in (False, True):  # the oracle's episode, then a random one (every other command's phrasing)
            _, info = env.reset(seed=seed)
            done = False
            while not done:
                admissible = info["admissible_actions"]
                command = admissible[rng.integers(len(admissible))] if explore else env.unwrapped.expert_action()
                observation, _, terminated, truncated, info = env.step(command)
                phrasing[template(observation)] += 1
                done = terminated or truncated
    env.close()
    return rows, phrasing


def summary(rows: list[dict[str, Any]], phrasing: Counter, reference: Counter | None) -> dict[str, Any]:
    """Means over games (look tasks only for the lamp), unknown types, and (for ALFWorld) phrasing coverage."""

    def mean(key: str, subset=rows) -> float:
        return float(np.mean([float(r[key]) for r in subset])) if subset else float("nan")

    look = [r for r in rows if r["type"] == "look"]
    out = {
        "games": len(rows),
        **{key: mean(key) for key in ("receptacles", "objects", "door_share", "shared_location_share")},
        "max_receptacles": max(r["receptacles"] for r in rows),
        "off_receptacle": mean("off_receptacle"),
        "games_with_off_receptacle": float(np.mean([r["off_receptacle"] > 0 for r in rows])),
        **{key: mean(key) for key in ("targets", "search_width", "targets_behind_door", "objects_behind_door")},
        "look_floor_lamp": mean("floor_lamp", look),
        "unknown_goal_object": mean("unknown_goal_object"),
        "unknown_goal_receptacle": mean("unknown_goal_receptacle"),
        "unknown_receptacle_types": sorted({t for r in rows for t in r["unknown_receptacle_types"]}),
        "unknown_object_types": sorted({t for r in rows for t in r["unknown_object_types"]}),
        "phrasing_templates": len(phrasing),
    }
    if reference is not None:
        total = sum(phrasing.values())
        covered = sum(count for text, count in phrasing.items() if text in reference)
        out["phrasing_covered"] = covered / max(1, total)
        out["phrasing_missing"] = [text for text, _ in phrasing.most_common() if text not in reference][:8]
    return out


ROWS = (
    ("games", "games (tasks)", "{:.0f}"),
    ("receptacles", "receptacles per room (mean)", "{:.1f}"),
    ("max_receptacles", "receptacles per room (max)", "{:.0f}"),
    ("objects", "movable objects per room", "{:.1f}"),
    ("door_share", "receptacles with a door", "{:.2f}"),
    ("shared_location_share", "receptacles sharing a location", "{:.2f}"),
    ("off_receptacle", "objects outside every receptacle", "{:.2f}"),
    ("games_with_off_receptacle", "games with such an object", "{:.2f}"),
    ("targets", "goal-object instances", "{:.2f}"),
    ("search_width", "receptacles that can hold the goal object", "{:.1f}"),
    ("targets_behind_door", "goal objects starting behind a door", "{:.2f}"),
    ("objects_behind_door", "movable objects starting behind a door", "{:.2f}"),
    ("look_floor_lamp", "look tasks with a floor lamp", "{:.2f}"),
    ("unknown_goal_object", "goal object type unknown to MiniHouse", "{:.2f}"),
    ("unknown_goal_receptacle", "goal receptacle type unknown to MiniHouse", "{:.2f}"),
    ("phrasing_covered", "walkthrough observations MiniHouse phrases alike", "{:.2f}"),
)


def table(columns: dict[str, dict[str, Any]]) -> str:
    names = list(columns)
    lines = ["| statistic | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for key, label, fmt in ROWS:
        cells = [fmt.format(columns[n][key]) if key in columns[n] else "-" for n in names]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--splits", nargs="+", default=["valid_seen", "valid_unseen"], help="ALFWorld splits")
    parser.add_argument("--houses", type=int, default=500, help="MiniHouse full-size tasks 0..N-1")
    parser.add_argument("--games", type=int, default=None, help="first N games of each split (default: all)")
    parser.add_argument(
        "--minihouse-kwargs", action="append", default=[], metavar="JSON",
        help="MiniHouse variant to compare (repeatable); default: the full-size preset",
    )  # fmt: skip
    parser.add_argument("--out", default=None, help="folder for fidelity.json and fidelity.md")
    args = parser.parse_args(argv)

    columns, phrasings = {}, Counter()
    for text in args.minihouse_kwargs or ["{}"]:
        kwargs = json.loads(text)
        house_rows, house_phrasing = minihouse_houses(args.houses, kwargs)
        label = "MiniHouse full" + (f" {json.dumps(kwargs)}" if kwargs else "")
        columns[label] = summary(house_rows, house_phrasing, None)
        phrasings.update(house_phrasing)
    for split in args.splits:
        rows, phrasing = alfworld_games(split, args.games)
        columns[f"ALFWorld {split}"] = summary(rows, phrasing, phrasings)
    text = table(columns)
    print(text)
    for name, column in columns.items():
        for key in ("unknown_receptacle_types", "unknown_object_types", "phrasing_missing"):
            if column.get(key):
                print(f"\n{name}, {key.replace('_', ' ')}: {column[key]}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "fidelity.json").write_text(json.dumps(columns, indent=2))
        (out / "fidelity.md").write_text(text + "\n")
        print(f"\nwrote {out / 'fidelity.json'} and {out / 'fidelity.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
