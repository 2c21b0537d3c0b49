"""Write a MiniHouse task as an ALFWorld game (``game.tw-pddl``) that the real TextWorld engine can play.

The problem uses ALFWorld's own domain (``alfred.pddl``) and grammar (``alfred.twl2``) and names its entities so
that ALFWorld's demangler gives them MiniHouse's names ("cabinet 2", "sinkbasin 1"). This is how the tests check
that MiniHouse plays like the real engine, and how a MiniHouse task can be handed to any ALFWorld tool.
"""

from __future__ import annotations

import importlib.util
import pathlib

from gagpo_gym.envs.minihouse import vocab
from gagpo_gym.envs.minihouse.house import CLEAN, COOL, HOT, MIDDLE, ON, SLICED, TOGGLED, House

_FLAG_FACTS = ((CLEAN, "isClean"), (HOT, "isHot"), (COOL, "isCool"), (SLICED, "isSliced"), (ON, "isOn"))
_GOALS = {  # alfworld.gen.goal_library's PDDL goals, with its "#" written as PDDL's "-"
    "pick": "(exists (?r - receptacle) (exists (?o - object) (and (inReceptacle ?o ?r) (objectType ?o {obj}Type) "
    "(receptacleType ?r {recep}Type))))",
    "clean": "(exists (?r - receptacle) (exists (?o - object) (and (cleanable ?o) (objectType ?o {obj}Type) "
    "(receptacleType ?r {recep}Type) (isClean ?o) (inReceptacle ?o ?r))))",
    "heat": "(exists (?r - receptacle) (exists (?o - object) (and (heatable ?o) (objectType ?o {obj}Type) "
    "(receptacleType ?r {recep}Type) (isHot ?o) (inReceptacle ?o ?r))))",
    "cool": "(exists (?r - receptacle) (exists (?o - object) (and (coolable ?o) (objectType ?o {obj}Type) "
    "(receptacleType ?r {recep}Type) (isCool ?o) (inReceptacle ?o ?r))))",
    "pick2": "(exists (?r - receptacle) (exists (?o1 - object) (and (objectType ?o1 {obj}Type) "
    "(receptacleType ?r {recep}Type) (inReceptacle ?o1 ?r) (exists (?o2 - object) (and (not (= ?o1 ?o2)) "
    "(objectType ?o2 {obj}Type) (receptacleType ?r {recep}Type) (inReceptacle ?o2 ?r))))))",
    "look": "(and (exists (?ot - object ?r - receptacle ?a - agent ?l - location) (and (objectType ?ot {toggle}Type) "
    "(toggleable ?ot) (isToggled ?ot) (receptacleAtLocation ?r ?l) (atLocation ?a ?l) (inReceptacle ?ot ?r))) "
    "(exists (?o - object ?a - agent) (and (objectType ?o {obj}Type) (holds ?a ?o))))",
}


def alfworld_logic() -> tuple[str, str]:
    """ALFWorld's PDDL domain and text grammar, read from the installed package without importing it."""
    spec = importlib.util.find_spec("alfworld")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("exporting to ALFWorld needs the alfworld extra: pip install 'gagpo-gym[alfworld]'")
    data = pathlib.Path(spec.submodule_search_locations[0]) / "data"
    return (data / "alfred.pddl").read_text(), (data / "alfred.twl2").read_text()


def _entity_ids(names: list[str], types: list[str]) -> list[str]:
    """Ids that ALFWorld's demangler turns back into ``names``: it sorts the ids and numbers each type downwards."""
    counts: dict[str, int] = {}
    for rtype in types:
        counts[rtype] = counts.get(rtype, 0) + 1
    ids = []
    for name, rtype in zip(names, types):
        position = counts[rtype] - int(name.rsplit(" ", 1)[1])  # number n gets the first sorted id
        if rtype.endswith("Basin"):  # the demangler names "Sink_bar_..._bar_SinkBasin" "sinkbasin"
            ids.append(f"{rtype[: -len('Basin')]}_bar_{position:03d}_bar_{rtype}")
        else:
            ids.append(f"{rtype}_bar_{position:03d}")
    return ids


def to_tw_pddl(house: House, walkthrough: list[str] | None = None) -> dict:
    """The house's current true state and goal as a ``game.tw-pddl`` dictionary (write it with ``json.dump``)."""
    domain, grammar = alfworld_logic()
    rec_ids = _entity_ids(house.rec_name, house.rec_type)
    obj_ids = _entity_ids(house.obj_name, house.obj_type)
    locations = [f"loc_{r}" for r in range(len(rec_ids))]
    rtypes = sorted(set(house.rec_type))
    otypes = sorted(set(house.obj_type) | {vocab.LAMP, house.goal_object}.union(*vocab.CAN_CONTAIN.values()))
    declarations = ["agent1 - agent", "loc_start - location"]
    declarations += [f"{otype}Type - otype" for otype in otypes] + [f"{rtype}Type - rtype" for rtype in rtypes]
    declarations += [f"{i} - object" for i in obj_ids] + [f"{i} - receptacle" for i in rec_ids]
    declarations += [f"{loc} - location" for loc in locations]

    agent_at = "loc_start" if house.agent == MIDDLE else locations[house.agent]
    facts = [f"(atLocation agent1 {agent_at})"]
    for r, rid in enumerate(rec_ids):
        facts += [f"(receptacleType {rid} {house.rec_type[r]}Type)", f"(receptacleAtLocation {rid} {locations[r]})"]
        if house.rec_openable[r]:
            facts.append(f"(openable {rid})")
        if house.opened[r]:
            facts.append(f"(opened {rid})")
    for o, oid in enumerate(obj_ids):
        otype, flags = house.obj_type[o], house.flags[o]
        facts.append(f"(objectType {oid} {otype}Type)")
        if house.location[o] == MIDDLE:
            facts += [f"(holds agent1 {oid})", "(holdsAny agent1)"]
        else:
            r = house.location[o]
            facts += [f"(inReceptacle {oid} {rec_ids[r]})", f"(objectAtLocation {oid} {locations[r]})"]
        abilities = (
            (house.pickupable[o], "pickupable"),
            (otype in vocab.HEATABLE, "heatable"),
            (otype in vocab.COOLABLE, "coolable"),
            (otype in vocab.CLEANABLE, "cleanable"),
            (otype in vocab.SLICEABLE, "sliceable"),
            (otype == vocab.LAMP, "toggleable"),
            (otype in vocab.RECEPTACLE_OBJECTS, "isReceptacleObject"),
        )
        facts += [f"({predicate} {oid})" for has, predicate in abilities if has]
        facts += [f"({predicate} {oid})" for bit, predicate in _FLAG_FACTS if flags & bit]
        if flags & TOGGLED:
            facts.append(f"(isToggled {oid})")
    for rtype in rtypes:
        facts += [f"(canContain {rtype}Type {otype}Type)" for otype in sorted(vocab.CAN_CONTAIN[rtype])]

    goal = _GOALS[house.task_type].format(obj=house.goal_object, recep=house.goal_receptacle or "", toggle=vocab.LAMP)
    problem = (
        f"(define (problem {house.task_id.replace('/', '_')})\n(:domain alfred)\n(:objects\n"
        + "\n".join(declarations)
        + "\n)\n(:init\n"
        + "\n".join(facts)
        + f"\n)\n(:goal {goal})\n)\n"
    )
    task_line = "Your task is to: UNKNOWN GOAL."
    if task_line not in grammar:
        raise ValueError("this alfworld version's grammar has no goal placeholder to fill")
    return {
        "pddl_domain": domain,
        "grammar": grammar.replace(task_line, "Your task is to: " + house.task),
        "pddl_problem": problem,
        "solvable": True,
        "walkthrough": list(walkthrough or []),
    }
