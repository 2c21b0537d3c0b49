"""ALFWorld's vocabulary, so that MiniHouse speaks the language of the real games.

Every table here comes from alfworld 0.4.2 (``tests/test_minihouse.py`` checks the ones that exist there verbatim):

* :data:`CAN_CONTAIN` is ``alfworld.gen.constants.VAL_RECEPTACLE_OBJECTS`` restricted to static receptacles and
  whole (unsliced) objects: it is the ``canContain`` fact set of every ALFWorld game, so it decides where
  ``move X to Y`` is admissible;
* :data:`HEATABLE`, :data:`COOLABLE`, :data:`CLEANABLE`, :data:`SLICEABLE` are ``VAL_ACTION_OBJECTS``;
  :data:`RECEPTACLE_OBJECTS` are the objects with ``isReceptacleObject`` (``MOVABLE_RECEPTACLES``);
* :data:`TASK_ROOMS` is ``GOALS_VALID`` and :data:`GOAL_TEMPLATES` is ``alfworld.gen.goal_library``;
* the room tables (:data:`ROOM_RECEPTACLES`, :data:`ROOM_OBJECTS`) are statistics of the ALFWorld scenes seen in
  training (the ``valid_seen`` split: 76 scenes): how often a receptacle type is present in a room kind, how many
  of it there are, and how often each pickupable object type occurs. Objects that no receptacle can hold
  (teddybear, boots, scrubbrush, papertowelroll) are left out, since once taken they could never be put down.

Types are ALFWorld's CamelCase names; the text shows them lower-cased (``CounterTop`` -> ``countertop 1``).
"""

from __future__ import annotations

#: Short task-type names (the env's ``task_type``) and ALFWorld's names for them.
TASK_TYPES: dict[str, str] = {
    "pick": "pick_and_place_simple",
    "look": "look_at_obj_in_light",
    "clean": "pick_clean_then_place_in_recep",
    "heat": "pick_heat_then_place_in_recep",
    "cool": "pick_cool_then_place_in_recep",
    "pick2": "pick_two_obj_and_place",
}

ROOM_KINDS: tuple[str, ...] = ("kitchen", "livingroom", "bedroom", "bathroom")

#: Room kinds where ALFWorld generates each task type (``GOALS_VALID``).
TASK_ROOMS: dict[str, tuple[str, ...]] = {
    "pick": ("kitchen", "livingroom", "bedroom", "bathroom"),
    "look": ("livingroom", "bedroom"),
    "clean": ("kitchen", "bathroom"),
    "heat": ("kitchen",),
    "cool": ("kitchen",),
    "pick2": ("kitchen", "livingroom", "bedroom", "bathroom"),
}

#: ALFWorld's goal sentences (``goal_library.gdict[...]['templates']``), one drawn per task.
GOAL_TEMPLATES: dict[str, tuple[str, ...]] = {
    "pick": ("put a {obj} in {recep}.", "put some {obj} on {recep}."),
    "look": ("look at {obj} under the {toggle}.", "examine the {obj} with the {toggle}."),
    "clean": ("put a clean {obj} in {recep}.", "clean some {obj} and put it in {recep}."),
    "heat": ("put a hot {obj} in {recep}.", "heat some {obj} and put it in {recep}."),
    "cool": ("put a cool {obj} in {recep}.", "cool some {obj} and put it in {recep}."),
    "pick2": ("put two {obj} in {recep}.", "find two {obj} and put them in {recep}."),
}

#: The receptacle type each state-changing task type needs (the PDDL actions' preconditions).
APPLIANCE: dict[str, str] = {"clean": "SinkBasin", "heat": "Microwave", "cool": "Fridge"}

#: Receptacle types that ALFWorld's games use as goal receptacles (the parent targets of both evaluation splits);
#: sinks, bathtubs, towel holders, hampers, toasters and TV stands never are.
GOAL_RECEPTACLES = frozenset(
    [
        "ArmChair",
        "Bed",
        "Cabinet",
        "Cart",
        "CoffeeMachine",
        "CoffeeTable",
        "CounterTop",
        "Desk",
        "DiningTable",
        "Drawer",
        "Dresser",
        "Fridge",
        "GarbageCan",
        "Microwave",
        "Ottoman",
        "Safe",
        "Shelf",
        "SideTable",
        "Sofa",
        "StoveBurner",
        "Toilet",
        "ToiletPaperHanger",
    ]
)

#: Receptacle types that ALFWorld's games declare ``openable`` (``OPENABLE_CLASS_LIST`` minus the Box object).
ALWAYS_OPENABLE = frozenset({"Fridge", "Microwave", "Safe"})
#: Cabinets and drawers are openable in about 83% of ALFWorld's scenes (the rest are open shelves).
SOMETIMES_OPENABLE: dict[str, float] = {"Cabinet": 0.83, "Drawer": 0.83}

#: Where the desk lamp of a ``look`` task stands in ALFWorld's scenes.
LAMP_HOLDERS = ("Desk", "SideTable", "Dresser", "Shelf")
LAMP = "DeskLamp"

HEATABLE = frozenset(["Apple", "Bread", "Cup", "Egg", "Mug", "Plate", "Potato", "Tomato"])
COOLABLE = frozenset(
    ["Apple", "Bowl", "Bread", "Cup", "Egg", "Lettuce", "Mug", "Pan", "Plate", "Pot", "Potato", "Tomato", "WineBottle"]
)
CLEANABLE = frozenset(
    [
        "Apple",
        "Bowl",
        "ButterKnife",
        "Cloth",
        "Cup",
        "DishSponge",
        "Egg",
        "Fork",
        "Kettle",
        "Knife",
        "Ladle",
        "Lettuce",
        "Mug",
        "Pan",
        "Plate",
        "Pot",
        "Potato",
        "SoapBar",
        "Spatula",
        "Spoon",
        "Tomato",
    ]
)
SLICEABLE = frozenset(["Apple", "Bread", "Egg", "Lettuce", "Potato", "Tomato"])
SHARP = frozenset({"Knife", "ButterKnife"})  # SliceObject's precondition
RECEPTACLE_OBJECTS = frozenset(["Bowl", "Box", "Cup", "Mug", "Pan", "Plate", "Pot"])

_TABLE_OBJECTS = (
    "AlarmClock Apple BaseballBat BasketBall Book Bowl Box Bread ButterKnife CD Candle CellPhone Cloth CreditCard "
    "Cup DishSponge Egg Fork Glassbottle HandTowel Kettle KeyChain Knife Ladle Laptop Lettuce Mug Newspaper Pan "
    "PaperTowel Pen Pencil PepperShaker Plate Pot Potato RemoteControl SaltShaker SoapBar SoapBottle Spatula Spoon "
    "SprayBottle Statue TennisRacket TissueBox ToiletPaper ToiletPaperRoll Tomato Vase Watch WateringCan WineBottle"
)
_SEAT_OBJECTS = "BasketBall Book Box CellPhone Cloth CreditCard KeyChain Laptop Newspaper Pillow RemoteControl"

#: Which object types each receptacle type can hold (``canContain``).
CAN_CONTAIN: dict[str, frozenset[str]] = {
    name: frozenset(objects.split())
    for name, objects in {
        "ArmChair": _SEAT_OBJECTS,
        "BathtubBasin": "Cloth DishSponge HandTowel SoapBar",
        "Bed": "BaseballBat BasketBall Book CellPhone Laptop Newspaper Pillow TennisRacket",
        "Cabinet": (
            "Book Bowl Box CD Candle Cloth Cup DishSponge Glassbottle HandTowel Kettle Ladle Mug Newspaper Pan "
            "PepperShaker Plate Plunger Pot SaltShaker SoapBar SoapBottle SprayBottle TissueBox ToiletPaper "
            "ToiletPaperRoll Vase WateringCan WineBottle"
        ),
        "Cart": (
            "Candle Cloth DishSponge HandTowel Mug PaperTowel Plunger SoapBar SoapBottle SprayBottle Statue "
            "TissueBox ToiletPaper ToiletPaperRoll Vase"
        ),
        "CoffeeMachine": "Mug",
        "CoffeeTable": _TABLE_OBJECTS,
        "CounterTop": _TABLE_OBJECTS,
        "Desk": (
            "AlarmClock BasketBall Book Bowl Box CD Candle CellPhone Cloth CreditCard Cup Glassbottle KeyChain "
            "Laptop Mug Newspaper Pen Pencil Plate RemoteControl SoapBottle SprayBottle Statue TennisRacket "
            "TissueBox ToiletPaper ToiletPaperRoll Vase Watch WateringCan WineBottle"
        ),
        "DiningTable": _TABLE_OBJECTS,
        "Drawer": (
            "Book ButterKnife CD Candle CellPhone Cloth CreditCard DishSponge Fork HandTowel KeyChain Knife Ladle "
            "Newspaper Pen Pencil PepperShaker RemoteControl SaltShaker SoapBar SoapBottle Spatula Spoon "
            "SprayBottle TissueBox ToiletPaper ToiletPaperRoll Watch WateringCan"
        ),
        "Dresser": (
            "AlarmClock BasketBall Book Bowl Box CD Candle CellPhone Cloth CreditCard Cup Glassbottle KeyChain "
            "Laptop Mug Newspaper Pen Pencil Plate RemoteControl SprayBottle Statue TennisRacket TissueBox "
            "ToiletPaper ToiletPaperRoll Vase Watch WateringCan WineBottle"
        ),
        "Fridge": "Apple Bowl Bread Cup Egg Glassbottle Lettuce Mug Pan Plate Pot Potato Tomato WineBottle",
        "GarbageCan": (
            "Apple Bread CD Cloth DishSponge Egg HandTowel Lettuce Newspaper PaperTowel Pen Pencil Potato SoapBar "
            "SoapBottle SprayBottle TissueBox ToiletPaper ToiletPaperRoll Tomato WineBottle"
        ),
        "HandTowelHolder": "HandTowel",
        "LaundryHamper": "Cloth",
        "Microwave": "Apple Bowl Bread Cup Egg Glassbottle Mug Plate Potato Tomato",
        "Ottoman": _SEAT_OBJECTS,
        "Safe": "CD CellPhone CreditCard KeyChain Statue Vase Watch",
        "Shelf": (
            "AlarmClock Book Bowl Box CD Candle CellPhone Cloth CreditCard Cup DishSponge Glassbottle HandTowel "
            "Kettle KeyChain Mug Newspaper PaperTowel Pen Pencil PepperShaker Plate Pot RemoteControl SaltShaker "
            "SoapBar SoapBottle SprayBottle Statue TissueBox ToiletPaper ToiletPaperRoll Vase Watch WateringCan "
            "WineBottle"
        ),
        "SideTable": _TABLE_OBJECTS,
        "SinkBasin": (
            "Apple Bowl ButterKnife Cloth Cup DishSponge Egg Fork Glassbottle HandTowel Kettle Knife Ladle Lettuce "
            "Mug Pan Plate Pot Potato SoapBar Spatula Spoon Tomato"
        ),
        "Sofa": _SEAT_OBJECTS,
        "StoveBurner": "Kettle Pan Pot",
        "TVStand": "TissueBox",
        "Toaster": "",  # holds only sliced bread, which MiniHouse does not model as a separate object
        "Toilet": (
            "Candle Cloth DishSponge HandTowel Newspaper PaperTowel SoapBar SoapBottle SprayBottle TissueBox "
            "ToiletPaper ToiletPaperRoll"
        ),
        "ToiletPaperHanger": "ToiletPaper ToiletPaperRoll",
        "TowelHolder": "Towel",
    }.items()
}

#: Per room kind: (receptacle type, probability that a scene has it, min count, max count) for ``size="full"``.
ROOM_RECEPTACLES: dict[str, tuple[tuple[str, float, int, int], ...]] = {
    "kitchen": (
        ("Cabinet", 1.0, 4, 18),
        ("CoffeeMachine", 1.0, 1, 1),
        ("CounterTop", 1.0, 1, 3),
        ("Fridge", 1.0, 1, 1),
        ("GarbageCan", 1.0, 1, 1),
        ("Microwave", 1.0, 1, 1),
        ("SinkBasin", 1.0, 1, 1),
        ("StoveBurner", 1.0, 2, 4),
        ("Toaster", 1.0, 1, 1),
        ("Drawer", 0.96, 1, 9),
        ("DiningTable", 0.56, 1, 2),
        ("Shelf", 0.15, 1, 3),
        ("SideTable", 0.11, 1, 1),
        ("Safe", 0.04, 1, 1),
    ),
    "livingroom": (
        ("ArmChair", 1.0, 1, 2),
        ("GarbageCan", 1.0, 1, 1),
        ("Sofa", 1.0, 1, 1),
        ("Drawer", 0.83, 1, 8),
        ("CoffeeTable", 0.75, 1, 2),
        ("SideTable", 0.75, 1, 4),
        ("DiningTable", 0.67, 1, 1),
        ("Dresser", 0.33, 1, 1),
        ("Shelf", 0.33, 1, 8),
        ("TVStand", 0.33, 1, 1),
        ("Cabinet", 0.17, 1, 6),
        ("Ottoman", 0.17, 1, 1),
        ("Desk", 0.08, 1, 1),
        ("Safe", 0.08, 1, 1),
    ),
    "bedroom": (
        ("Bed", 1.0, 1, 1),
        ("GarbageCan", 1.0, 1, 1),
        ("Drawer", 0.94, 1, 8),
        ("Desk", 0.78, 1, 2),
        ("Shelf", 0.72, 1, 6),
        ("Dresser", 0.56, 1, 1),
        ("SideTable", 0.56, 1, 2),
        ("ArmChair", 0.17, 1, 1),
        ("LaundryHamper", 0.17, 1, 1),
        ("Cabinet", 0.11, 1, 4),
        ("DiningTable", 0.11, 1, 1),
        ("Safe", 0.11, 1, 1),
        ("CounterTop", 0.06, 1, 1),
    ),
    "bathroom": (
        ("GarbageCan", 1.0, 1, 1),
        ("HandTowelHolder", 1.0, 1, 2),
        ("SinkBasin", 1.0, 1, 2),
        ("Toilet", 1.0, 1, 1),
        ("ToiletPaperHanger", 1.0, 1, 1),
        ("TowelHolder", 1.0, 1, 1),
        ("CounterTop", 0.84, 1, 1),
        ("BathtubBasin", 0.79, 1, 1),
        ("Cabinet", 0.58, 1, 6),
        ("Drawer", 0.42, 1, 6),
        ("Shelf", 0.26, 1, 3),
        ("Dresser", 0.11, 1, 1),
        ("Cart", 0.05, 1, 1),
        ("SideTable", 0.05, 1, 1),
    ),
}

#: Per room kind: pickupable object types and how often they occur in ALFWorld's scenes (sampling weights).
ROOM_OBJECTS: dict[str, dict[str, int]] = {
    "kitchen": {
        "Cup": 56,
        "SaltShaker": 56,
        "Fork": 56,
        "Spoon": 55,
        "Bowl": 54,
        "Potato": 54,
        "Spatula": 54,
        "PepperShaker": 52,
        "Mug": 52,
        "Plate": 52,
        "Knife": 52,
        "Tomato": 52,
        "ButterKnife": 51,
        "Apple": 51,
        "Bread": 49,
        "SoapBottle": 48,
        "DishSponge": 46,
        "Egg": 43,
        "Lettuce": 42,
        "Pot": 40,
        "Pan": 31,
        "Kettle": 21,
        "WineBottle": 18,
        "Ladle": 12,
        "Glassbottle": 12,
        "Vase": 8,
        "CellPhone": 7,
        "Pencil": 5,
        "SprayBottle": 5,
        "Statue": 4,
        "Book": 3,
        "CreditCard": 3,
        "Pen": 2,
    },  # fmt: skip
    "livingroom": {
        "Statue": 32,
        "RemoteControl": 28,
        "CreditCard": 25,
        "KeyChain": 24,
        "Laptop": 23,
        "Box": 21,
        "Vase": 21,
        "Pillow": 14,
        "Watch": 14,
        "Newspaper": 13,
        "TissueBox": 10,
        "Book": 9,
        "Plate": 9,
        "CellPhone": 7,
        "Pencil": 7,
        "WateringCan": 5,
        "Pen": 4,
        "Bowl": 4,
        "Candle": 3,
    },  # fmt: skip
    "bedroom": {
        "CreditCard": 43,
        "CD": 41,
        "Pencil": 37,
        "Pen": 36,
        "CellPhone": 35,
        "KeyChain": 35,
        "Book": 34,
        "Pillow": 30,
        "AlarmClock": 30,
        "Laptop": 25,
        "Mug": 20,
        "Bowl": 14,
        "Box": 10,
        "BaseballBat": 9,
        "TennisRacket": 8,
        "TissueBox": 7,
        "BasketBall": 7,
        "Vase": 6,
        "Statue": 4,
        "RemoteControl": 2,
        "Watch": 1,
        "Cloth": 1,
    },  # fmt: skip
    "bathroom": {
        "Candle": 46,
        "ToiletPaper": 45,
        "SprayBottle": 45,
        "SoapBar": 39,
        "SoapBottle": 39,
        "Cloth": 36,
        "Towel": 22,
        "HandTowel": 22,
        "Plunger": 19,
        "TissueBox": 8,
        "DishSponge": 6,
    },  # fmt: skip
}

#: Pickupable objects per scene in ALFWorld's room kinds (min, max), used for ``size="full"`` distractors.
ROOM_OBJECT_COUNTS: dict[str, tuple[int, int]] = {
    "kitchen": (30, 45),
    "livingroom": (14, 28),
    "bedroom": (18, 28),
    "bathroom": (12, 20),
}
