"""Facts a user states in passing, and questions about them in two wordings: one that shares a
word with the statement (`lexical`) and one that shares none of its content words (`paraphrase`,
checked by `shares_content_word`). Answers are free text, scored by the value's exact word."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from sinkd.daemon.store.search import query_terms


@dataclass(frozen=True)
class FactKind:
    name: str
    statement: str  # "{v}" is the value
    values: tuple[str, ...]
    lexical: str
    paraphrase: str


KINDS: tuple[FactKind, ...] = (
    FactKind("name", "My name is {v}.", ("Ada", "Bruno", "Chiara", "Dmitri", "Elif", "Farid", "Greta", "Hiro"),
             "What is my name?", "What am I called?"),
    FactKind("city", "I live in {v} these days.", ("Lisbon", "Oslo", "Nairobi", "Lima", "Hanoi", "Quebec", "Tbilisi", "Perth"),
             "Which city do I live in?", "Where is my home?"),
    FactKind("dog", "My dog is named {v}.", ("Pixel", "Mango", "Biscuit", "Nimbus", "Pepper", "Waffles", "Juniper", "Comet"),
             "What is my dog named?", "What do I call my puppy?"),
    FactKind("job", "I work as a {v}.", ("carpenter", "dentist", "pilot", "librarian", "plumber", "chemist", "baker", "surveyor"),
             "What do I work as?", "What is my profession?"),
    FactKind("colour", "My favourite colour is {v}.", ("teal", "maroon", "amber", "violet", "olive", "crimson", "indigo", "ochre"),
             "What is my favourite colour?", "Which hue do I like best?"),
    FactKind("car", "I drive an old {v}.", ("Volvo", "Saab", "Fiat", "Skoda", "Lada", "Peugeot", "Subaru", "Citroen"),
             "What do I drive?", "Which make of automobile do I own?"),
    FactKind("sister", "My sister is called {v}.", ("Mira", "Lena", "Noor", "Ines", "Katya", "Sofia", "Yara", "Tove"),
             "What is my sister called?", "What is the name of my sibling?"),
    FactKind("instrument", "I play the {v} in a band.", ("cello", "oboe", "banjo", "trumpet", "harp", "tuba", "violin", "clarinet"),
             "Which instrument do I play in the band?", "What do I perform on in the group?"),
    FactKind("password", "The wifi password is {v}.", ("tulip42", "maple17", "cobalt88", "raven05", "lotus31", "ember64", "quartz29", "falcon73"),
             "What is the wifi password?", "What is the network passphrase?"),
    FactKind("doctor", "My doctor is Dr. {v}.", ("Okafor", "Lindqvist", "Moreau", "Tanaka", "Novak", "Herrera", "Kowalski", "Mensah"),
             "What is my doctor's name?", "Who is my physician?"),
    FactKind("allergy", "I am allergic to {v}.", ("peanuts", "shellfish", "penicillin", "pollen", "latex", "sesame", "walnuts", "gluten"),
             "What am I allergic to?", "Which substance gives me a bad reaction?"),
    FactKind("birthday", "My birthday is in {v}.", ("March", "July", "October", "January", "May", "August", "November", "April"),
             "When is my birthday?", "In which month was I born?"),
    FactKind("daughter", "My daughter is named {v}.", ("Alma", "Frida", "Zoe", "Maren", "Lucia", "Ingrid", "Amara", "Cleo"),
             "What is my daughter named?", "What is my child called?"),
    FactKind("sport", "On weekends I play {v}.", ("badminton", "rugby", "squash", "curling", "hockey", "volleyball", "cricket", "handball"),
             "What do I play on weekends?", "Which game do I enjoy on Saturdays?"),
    FactKind("dish", "My favourite dish is {v}.", ("paella", "ramen", "goulash", "lasagne", "biryani", "pierogi", "falafel", "moussaka"),
             "What is my favourite dish?", "Which meal do I love most?"),
    FactKind("language", "I am learning {v} at night school.", ("Finnish", "Swahili", "Korean", "Greek", "Dutch", "Turkish", "Polish", "Welsh"),
             "Which language am I learning?", "What tongue am I studying in the evenings?"),
    FactKind("boat", "I keep a boat called {v}.", ("Albatross", "Seagull", "Marlin", "Osprey", "Dolphin", "Pelican", "Heron", "Kestrel"),
             "What is my boat called?", "What is the name of my vessel?"),
    FactKind("office", "My office is on {v} Street.", ("Elm", "Birch", "Cedar", "Willow", "Aspen", "Rowan", "Hazel", "Linden"),
             "Which street is my office on?", "Where is my workplace located?"),
    FactKind("number", "My lucky number is {v}.", ("17", "23", "42", "58", "64", "71", "86", "93"),
             "What is my lucky number?", "Which figure brings me fortune?"),
    FactKind("collection", "I collect old {v}.", ("stamps", "coins", "maps", "clocks", "postcards", "keys", "radios", "teapots"),
             "What do I collect?", "What kind of thing do I hoard?"),
)  # fmt: skip

WORDINGS = ("lexical", "paraphrase")


@dataclass(frozen=True)
class Fact:
    kind: FactKind
    value: str

    @property
    def statement(self) -> str:
        return self.kind.statement.format(v=self.value)

    def question(self, wording: str) -> str:
        return self.kind.lexical if wording == "lexical" else self.kind.paraphrase

    def answered(self, answer: str) -> bool:
        """The value as a word of the answer (any case)."""
        return re.search(rf"\b{re.escape(self.value)}\b", answer, re.IGNORECASE) is not None


def draw(rng: random.Random) -> list[Fact]:
    """One value for each kind, in a random order."""
    kinds = list(KINDS)
    rng.shuffle(kinds)
    return [Fact(k, rng.choice(k.values)) for k in kinds]


def _stem(word: str) -> str:
    return word[:5]  # a crude stem: "named"/"name" and "lives"/"live" count as shared


def shares_content_word(statement: str, question: str) -> bool:
    a = {_stem(w) for w in query_terms(statement)}
    return any(_stem(w) in a for w in query_terms(question))
