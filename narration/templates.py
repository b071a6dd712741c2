"""A streaming log template miner: Drain (He et al., ICWS 2017), as IBM's `drain3` runs it.

A line's tokens go down a fixed-depth tree: by token count, then by its first tokens (a token with
a digit takes the wildcard branch). A leaf holds templates; the line joins the most similar one
(the share of positions that agree) if that share reaches `similarity`, turning the positions that
differ into `<*>`, else it starts a new template. Tokens that are plainly values (numbers, hex,
addresses) are masked before the tree sees them, so `pid 4411` and `pid 98` share a template.

Memory is bounded: at most `max_templates`, the least recently seen forgotten first (as drain3's
`max_clusters`); a forgotten template that comes back is new again, under a new id.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

MASK = "<*>"
# values, not words: masked before the tree sees them (drain3's masking instructions, trimmed)
_VALUE = re.compile(
    r"""^(?:
        [-+]?\d+(?:[.,:]\d+)*[a-zA-Z%]{0,3}      # 12, 3.5, 10:42:07, 512MB, 80%
      | 0x[0-9a-fA-F]+                           # 0x1f
      | [0-9a-fA-F]{8,}                          # long hex: hashes, addresses
      | \d{1,3}(?:\.\d{1,3}){3}(?::\d+)?         # IPv4[:port]
      | [0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}  # UUID
    )$""",
    re.VERBOSE,
)
_HAS_DIGIT = re.compile(r"\d")


def tokens_of(line: str) -> list[str]:
    """Whitespace tokens, values masked."""
    return [MASK if _VALUE.match(t.strip("[](),;\"'")) else t for t in line.split()]


@dataclass
class Template:
    id: int
    tokens: list[str]
    count: int = 0
    first_line: int = 0  # the line number that started it
    path: tuple[object, ...] = field(default=(), repr=False)  # its leaf's key in the tree

    def text(self) -> str:
        return " ".join(self.tokens)


@dataclass(frozen=True)
class Match:
    template: Template
    parameters: tuple[str, ...]  # the line's tokens where the template has <*>
    created: bool  # a template new with this line


class TemplateMiner:
    def __init__(
        self,
        depth: int = 4,
        similarity: float = 0.4,
        max_children: int = 100,
        max_templates: int = 5000,
    ) -> None:
        if depth < 3:
            raise ValueError("depth must be >= 3 (the length level, one token level, the leaves)")
        self.prefix_tokens = depth - 2
        self.similarity = similarity
        self.max_children = max_children
        self.max_templates = max_templates
        self._next_id = 1
        self._templates: OrderedDict[int, Template] = OrderedDict()  # least recently seen first
        self._leaves: dict[tuple[object, ...], list[int]] = {}
        self._children: dict[tuple[object, ...], set[object]] = {}

    def __len__(self) -> int:
        return len(self._templates)

    def get(self, template_id: int) -> Template | None:
        return self._templates.get(template_id)

    def add(self, line: str, line_no: int = 0, group: str = "") -> Match:
        """The line's template (new, or one it joins). Lines of different `group`s never share a
        template: the digest groups by severity, so that a failure worded like a success
        ("Failed password for root from ..." beside "Accepted publickey for deploy from ...")
        is a template of its own, not a success template that turned to error."""
        raw = line.split()
        masked = tokens_of(line)
        path = self._path(masked, group)
        leaf = self._leaves.setdefault(path, [])
        best, best_sim = None, -1.0
        for tid in leaf:
            t = self._templates[tid]
            sim = _similarity(t.tokens, masked)
            if sim > best_sim:
                best, best_sim = t, sim
        created = best is None or best_sim < self.similarity
        if created:
            best = Template(self._next_id, list(masked), first_line=line_no, path=path)
            self._next_id += 1
            self._templates[best.id] = best
            leaf.append(best.id)
            self._forget_oldest()
        else:
            assert best is not None
            best.tokens = [a if a == b else MASK for a, b in zip(best.tokens, masked, strict=True)]
            self._templates.move_to_end(best.id)
        best.count += 1
        params = tuple(r for r, t in zip(raw, best.tokens, strict=True) if t == MASK)
        return Match(best, params, created)

    def state(self) -> dict[str, Any]:
        """What the miner knows, as JSON-ready values: its templates in the order they were
        last seen, and its tree. `restored` gives a miner that groups the next lines as this one."""
        return {
            "settings": [
                self.prefix_tokens + 2,
                self.similarity,
                self.max_children,
                self.max_templates,
            ],
            "next_id": self._next_id,
            "templates": [
                [t.id, t.tokens, t.count, t.first_line, list(t.path)]
                for t in self._templates.values()
            ],
            "leaves": [[list(path), ids] for path, ids in self._leaves.items()],
            "children": [
                [list(path), sorted(keys, key=str)] for path, keys in self._children.items()
            ],
        }

    @classmethod
    def restored(cls, state: dict[str, Any]) -> TemplateMiner:
        depth, similarity, max_children, max_templates = state["settings"]
        miner = cls(depth, similarity, max_children, max_templates)
        miner._next_id = state["next_id"]
        for tid, tokens, count, first_line, path in state["templates"]:
            miner._templates[tid] = Template(tid, list(tokens), count, first_line, tuple(path))
        for path, ids in state["leaves"]:
            miner._leaves[tuple(path)] = list(ids)
        for path, keys in state["children"]:
            miner._children[tuple(path)] = set(keys)
        return miner

    def _path(self, masked: list[str], group: str = "") -> tuple[object, ...]:
        """The leaf a line goes to: its group and length, then its first tokens, each a branch of
        its own unless it holds a digit or its node already has `max_children` (the wildcard)."""
        path: tuple[object, ...] = (group, len(masked)) if group else (len(masked),)
        for token in masked[: self.prefix_tokens]:
            key = MASK if _HAS_DIGIT.search(token) else token
            children = self._children.setdefault(path, set())
            if key not in children:
                if len(children) >= self.max_children:
                    key = MASK
                children.add(key)
            path = (*path, key)
        return path

    def _forget_oldest(self) -> None:
        while len(self._templates) > self.max_templates:
            _, old = self._templates.popitem(last=False)
            leaf = self._leaves.get(old.path)
            if leaf is not None:
                leaf.remove(old.id)


def _similarity(template: list[str], tokens: list[str]) -> float:
    """Drain's simSeq: the share of positions where the template holds the same word. A wildcard
    agrees with nothing, as in drain3: otherwise lines made mostly of values (a header of
    timestamps and ids) would join one template whatever their words."""
    if not tokens:
        return 1.0
    same = sum(1 for a, b in zip(template, tokens, strict=True) if a == b and a != MASK)
    return same / len(tokens)
