"""Invented data sets in the layout and row shapes of ../shared/data (its README), for the tests
on a clone without the real data. Every row is made up here from small invented vocabularies:
no row of the real data sets is ever copied into the repository."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

# --- sql: {"question", "context", "answer"}, the sql-create-context shape ---------------------

# table -> (the noun for one row, its columns, its rows); the first column names the row
SQL_TABLES = {
    "lighthouse_keepers": (
        "keeper",
        ("keeper", "lighthouse", "coast", "years_served"),
        [
            ("Orla Fenwick", "Gullstone", "north", "12"),
            ("Bram Iddesleigh", "Corra Head", "west", "7"),
            ("Tamsin Quarrel", "Mistle Rock", "south", "21"),
            ("Idris Vantongeren", "Pellow Point", "east", "3"),
            ("Sunniva Draycott", "Gullstone", "north", "16"),
            ("Caspar Mbeki-Lowe", "Hobbs Tooth", "west", "9"),
        ],
    ),
    "glass_orchestras": (
        "orchestra",
        ("orchestra", "city", "conductor", "founded"),
        [
            ("Vellum Glass Ensemble", "Ostray", "Mira Calloway", "1971"),
            ("Harrowgate Chimes", "Lunmouth", "Pieter Osk", "1988"),
            ("Saltmarsh Harmonica Band", "Ostray", "Wren Adebayo", "2003"),
            ("Quillon Crystal Choir", "Brackwater", "Elsa Thornbury", "1995"),
            ("Tidewell Bell Consort", "Lunmouth", "Anselm Rook", "1962"),
            ("Frostpane Players", "Carrowby", "Dilys Marchetti", "2011"),
        ],
    ),
    "kite_festivals": (
        "festival",
        ("festival", "town", "month", "kites_flown"),
        [
            ("Windward Fair", "Pennick", "April", "340"),
            ("Skyloom Days", "Carrowby", "July", "1200"),
            ("Tailspin Gala", "Pennick", "September", "85"),
            ("Driftline Meet", "Oddacombe", "May", "610"),
            ("Updraft Carnival", "Lunmouth", "June", "455"),
            ("Stringbend Weekend", "Oddacombe", "August", "230"),
        ],
    ),
}
# (question, answer) over a table's slots: its columns key, a, b, c and one row name, va, vb, vc
SQL_QUESTIONS = [
    ("What is the {a} of the {noun} {name}?", "SELECT {a} FROM {table} WHERE {key} = '{name}'"),
    ("Which {noun} has {b} {vb}?", "SELECT {key} FROM {table} WHERE {b} = '{vb}'"),
    ("How many {noun}s have {a} {va}?", "SELECT COUNT({key}) FROM {table} WHERE {a} = '{va}'"),
    ("What is the {c} of the {noun} with {b} {vb}?", "SELECT {c} FROM {table} WHERE {b} = '{vb}'"),
    ("Name the {b} when the {c} is {vc}.", "SELECT {b} FROM {table} WHERE {c} = '{vc}'"),
]


def sql_rows() -> list[dict]:
    rows = []
    for table, (noun, columns, records) in SQL_TABLES.items():
        context = f"CREATE TABLE {table} ({', '.join(c + ' VARCHAR' for c in columns)})"
        key, a, b, c = columns
        for name, va, vb, vc in records:
            slots = dict(table=table, noun=noun, key=key, a=a, b=b, c=c)
            slots |= dict(name=name, va=va, vb=vb, vc=vc)
            rows += [
                {"question": q.format(**slots), "context": context, "answer": s.format(**slots)}
                for q, s in SQL_QUESTIONS
            ]
    return rows  # 3 tables x 6 rows x 5 questions = 90


# --- dialogsum: {"id", "dialogue", "summary", "topic"} ---------------------------------------

# (topic, dialogue, summary), over the slots below
DIALOGUES = [
    (
        "shopping",
        "#Person1#: Good afternoon, can I help you?\n"
        "#Person2#: Yes, I'm looking for a {thing} for my {relative}.\n"
        "#Person1#: This {colour} one is very popular. It's {price} dollars.\n"
        "#Person2#: That's a little more than I wanted to spend, but it's lovely. I'll take it.\n"
        "#Person1#: Would you like it wrapped?\n"
        "#Person2#: Yes, please. It's a present.",
        "#Person2# buys a {colour} {thing} for {price} dollars as a present for #Person2#'s "
        "{relative}.",
    ),
    (
        "appointment",
        "#Person1#: Doctor {name}'s surgery, how can I help you?\n"
        "#Person2#: I'd like to see the doctor about my {ailment}. It started last week.\n"
        "#Person1#: The first free time is on {day} at {hour}. Is that all right?\n"
        "#Person2#: {day} at {hour} is fine. Should I bring anything?\n"
        "#Person1#: Just your card, and please come ten minutes early.",
        "#Person2# books an appointment with Doctor {name} on {day} at {hour} about "
        "#Person2#'s {ailment}.",
    ),
    (
        "travel",
        "#Person1#: Where are you going for your holiday this year?\n"
        "#Person2#: We're taking the train to {town}. My {relative} lives there.\n"
        "#Person1#: How long will you stay?\n"
        "#Person2#: About {days} days. We want to visit the {sight} while we're there.\n"
        "#Person1#: That sounds wonderful. Don't forget your {thing}.",
        "#Person2# is going to {town} by train for {days} days to see #Person2#'s {relative} "
        "and visit the {sight}.",
    ),
]
SLOTS = {
    "thing": ["scarf", "umbrella", "teapot", "lamp", "notebook", "clock"],
    "relative": ["sister", "grandfather", "aunt", "cousin", "brother"],
    "colour": ["green", "yellow", "grey", "orange", "blue"],
    "price": ["18", "25", "40", "65"],
    "name": ["Pellworth", "Amadi", "Lindqvist", "Okonkwo"],
    "ailment": ["back pain", "sore throat", "headaches", "cough"],
    "day": ["Monday", "Tuesday", "Thursday", "Friday"],
    "hour": ["9 am", "11:30", "2 pm", "4:15"],
    "town": ["Carrowby", "Lunmouth", "Ostray", "Pennick"],
    "days": ["three", "five", "ten"],
    "sight": ["old harbour", "glass museum", "botanic garden", "castle ruins"],
}


def dialogsum_rows(split: str, n: int, rng: random.Random) -> list[dict]:
    rows = []
    for i in range(n):
        topic, dialogue, summary = DIALOGUES[i % len(DIALOGUES)]
        slots = {slot: rng.choice(values) for slot, values in SLOTS.items()}
        rows.append(
            {
                "id": f"{split}_{i}",
                "dialogue": dialogue.format(**slots),
                "summary": summary.format(**slots),
                "topic": topic,
            }
        )
    return rows


# --- e2e: CSV columns mr,ref, several refs per MR ---------------------------------------------

E2E_NAMES = [
    "Pebble Oven", "Saffron Tide", "Juniper Loft", "Brass Heron", "Tin Lantern", "Oakhollow",
    "Salted Fig", "Mossgate Inn", "Velvet Spoon", "Quillhouse", "Cinder Sage", "Rookery Bar",
]  # fmt: skip
E2E_VALUES = {
    "eatType": ["pub", "restaurant", "coffee shop"],
    "food": ["Italian", "Japanese", "French", "Indian", "English"],
    "priceRange": ["cheap", "moderate", "high"],
    "customer rating": ["low", "average", "high"],
    "area": ["riverside", "city centre"],
    "familyFriendly": ["yes", "no"],
    "near": ["Brackwater Bridge", "the Ostray Theatre", "Pennick Market"],
}
FAMILY = {"yes": "family-friendly", "no": "not family-friendly"}
# the attributes of an MR (after name, in E2E's order) -> its references
E2E_REFS = {
    ("eatType", "area"): [
        "{name} is a {eatType} in the {area} area.",
        "In the {area} area there is a {eatType} called {name}.",
        "{name} is a {eatType} located in the {area} area.",
    ],
    ("food", "priceRange"): [
        "{name} serves {food} food at {priceRange} prices.",
        "For {food} food at {priceRange} prices, try {name}.",
    ],
    ("eatType", "food", "near"): [
        "{name} is a {eatType} serving {food} food near {near}.",
        "Near {near} is {name}, a {eatType} that serves {food} food.",
    ],
    ("eatType", "customer rating", "familyFriendly"): [
        "{name} is a {eatType} rated {rating} by its customers; it is {family}.",
        "Rated {rating} by customers, {name} is a {eatType} that is {family}.",
    ],
}


def e2e_rows(names: list[str], rng: random.Random) -> list[dict]:
    """Every attribute combination once for each name, with random values: one MR each."""
    rows = []
    for name in names:
        for attributes, refs in E2E_REFS.items():
            values = {"name": name} | {a: rng.choice(E2E_VALUES[a]) for a in attributes}
            mr = ", ".join(f"{a}[{v}]" for a, v in values.items())
            slots = dict(values, rating=values.get("customer rating"))
            slots["family"] = FAMILY.get(values.get("familyFriendly"))
            rows += [{"mr": mr, "ref": ref.format(**slots)} for ref in refs]
    return rows


# --- instructions: {"prompt", "source", "category"} ------------------------------------------

SOURCE = "synthetic/specstream-tests@0000000"  # the attribution shape: <owner/repo>@<commit>
INSTRUCTION_TEMPLATES = {
    "open_qa": "What is the {noun} of a {thing} usually made of?",
    "brainstorming": "Give me five ideas for a {thing} that a {person} would enjoy.",
    "creative_writing": "Write a short poem about a {thing} left out in the rain by a {person}.",
    "coding": "Write a Python function that counts every {thing} in a list, for a {person}.",
    "classification": "Is a {thing} a tool, a toy or a piece of furniture? A {person} asks.",
    "math_word_problem": "A {person} buys 3 boxes of {thing}s with 12 in each box. How many "
    "{thing}s are there?",
}
INSTRUCTION_SLOTS = {
    "noun": ["handle", "frame", "lid"],
    "thing": ["teapot", "kite", "lantern", "stool", "compass", "marble", "drum", "basket"],
    "person": ["baker", "sailor", "child", "gardener", "librarian"],
}


def instruction_rows() -> list[dict]:
    rows = []
    for category, template in INSTRUCTION_TEMPLATES.items():
        for noun in INSTRUCTION_SLOTS["noun"]:
            for thing in INSTRUCTION_SLOTS["thing"]:
                for person in INSTRUCTION_SLOTS["person"]:
                    prompt = template.format(noun=noun, thing=thing, person=person)
                    rows.append({"prompt": prompt, "source": SOURCE, "category": category})
    return list({r["prompt"]: r for r in rows}.values())  # templates without {noun} repeat


# --- wikitext2: tokenised WikiText lines (" = Title = ", spaces around punctuation, <unk>) -----

# (title, [(section heading or None, paragraph)])
WIKITEXT_VALID = (
    "Varrow Isle",
    [
        (
            None,
            "Varrow Isle is a small island in the invented Brackwater Sound , about 14 km ( 9 mi ) "
            "off the coast of the fictional county of Ostray . It is known for its chalk cliffs , "
            "its colony of grey seals and the old <unk> lighthouse that stands on its northern "
            "point . The island has no permanent population today , but a warden lives there from "
            "April to October and looks after the paths and the small museum near the landing "
            "stage .",
        ),
        (
            "History",
            "People first settled on Varrow Isle in the late Bronze Age , when farmers from the "
            "mainland cleared the thin woods on the southern slopes and built round houses of "
            "stone and turf . In the twelfth century a small community of monks founded a chapel "
            "beside the spring , and the ruins of its walls can still be seen . Fishing families "
            "lived on the island until 1931 , when the last of them moved to the mainland because "
            "the school had closed and the harbour had silted up .",
        ),
        (
            "Wildlife",
            "The cliffs are home to thousands of nesting seabirds every summer , including "
            "puffins , razorbills and kittiwakes . Grey seals haul out on the pebble beaches of "
            "the eastern shore , and their pups are born there in the autumn . Because there are "
            "no rats or cats on the island , ground @-@ nesting birds breed in large numbers , and "
            "visitors are asked to keep to the marked paths between May and August .",
        ),
    ],
)
WIKITEXT_TRAIN = (
    "Elsa Thornbury",
    [
        (
            None,
            "Elsa Thornbury ( 1902 – 1978 ) was an invented composer and organist from the "
            "fictional town of Lunmouth . She wrote more than forty songs , two string quartets "
            "and a large number of pieces for the church organ , and she taught music at the town "
            "'s grammar school for most of her life . Her music was rarely played outside her own "
            "region while she was alive , but it has become better known since a collection of "
            "her songs was recorded in the 1990s .",
        ),
        (
            "Early life",
            "Thornbury was born in a house on Harbour Street , the youngest of five children of a "
            "ship 's carpenter and a seamstress . She began to play the piano at the age of six "
            "and was soon taking lessons from the organist of St <unk> 's Church , who allowed her "
            "to practise on the church organ in the evenings . At sixteen she won a scholarship "
            "to study in the capital , where she attended lectures on harmony and composition and "
            "sang in a large choir .",
        ),
        (
            "Works",
            "Most of Thornbury 's songs set poems by writers from her own coast , and many of "
            "them describe the sea , the weather and the lives of fishing families . Her first "
            "string quartet was performed in Lunmouth in 1934 and was praised in the local "
            "newspaper for its lively final movement . In later life she wrote mainly for the "
            "organ , and several of these pieces are still played at services in the churches of "
            "the region .",
        ),
    ],
)


def wikitext(article: tuple[str, list[tuple[str | None, str]]]) -> str:
    """An article in WikiText's raw lines: each starts and ends with a space, blank lines hold
    one space, headings are " = Title = " and " = = Section = = "."""
    title, sections = article
    lines = ["", f"= {title} =", ""]
    for heading, paragraph in sections:
        if heading:
            lines += [f"= = {heading} = =", ""]
        lines += [paragraph, ""]
    return "".join(f" {line} \n" if line else " \n" for line in lines)


# --- the folder ---------------------------------------------------------------------------------


def write_synthetic_data(root: Path) -> Path:
    """Write the invented data sets under `root` in the layout of ../shared/data; returns root."""
    rng = random.Random(0)
    sql = sql_rows()
    _write_jsonl(root / "sql" / "dev.jsonl", sql[::2])  # 45 rows each, every table in both
    _write_jsonl(root / "sql" / "train.jsonl", sql[1::2])
    _write_jsonl(root / "dialogsum" / "dev.jsonl", dialogsum_rows("dev", 12, rng))
    _write_jsonl(root / "dialogsum" / "train.jsonl", dialogsum_rows("train", 24, rng))
    _write_csv(root / "e2e" / "dev.csv", e2e_rows(E2E_NAMES[:3], rng))  # 12 MRs
    _write_csv(root / "e2e" / "train.csv", e2e_rows(E2E_NAMES[3:], rng))  # 36 MRs
    _write_jsonl(root / "instructions" / "instructions.jsonl", instruction_rows())
    (root / "wikitext2").mkdir(parents=True, exist_ok=True)
    (root / "wikitext2" / "valid.txt").write_text(wikitext(WIKITEXT_VALID), encoding="utf-8")
    (root / "wikitext2" / "train.txt").write_text(wikitext(WIKITEXT_TRAIN), encoding="utf-8")
    return root


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def _write_csv(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, ["mr", "ref"], quoting=csv.QUOTE_ALL)
        writer.writeheader()
        writer.writerows(rows)
