"""A line's severity, where the line says it.

In order: a syslog priority (`<11>`), then a level token near the start (`ERROR`, `[warn]`,
`level=error`, `error:`), then words that mean trouble (`failed`, `denied`, `panic`). A level the
line states wins over its words: BGL's `RAS KERNEL INFO ... parity error corrected` is INFO.
"""

from __future__ import annotations

import enum
import re


class Severity(enum.IntEnum):
    INFO = 1
    WARNING = 2
    ERROR = 3
    CRITICAL = 4

    @property
    def label(self) -> str:
        return self.name.lower()


ERROR_OR_WORSE = Severity.ERROR
_LEVELS = {
    **dict.fromkeys(
        ("emerg", "emergency", "alert", "crit", "critical", "fatal", "panic"), Severity.CRITICAL
    ),
    **dict.fromkeys(("err", "error", "severe", "failure"), Severity.ERROR),
    **dict.fromkeys(("warn", "warning"), Severity.WARNING),
    **dict.fromkeys(
        ("info", "notice", "debug", "trace", "fine", "finer", "verbose"), Severity.INFO
    ),
}
_SYSLOG_PRI = re.compile(r"^\s*<(\d{1,3})>")
_LEVEL_KV = re.compile(r"\b(?:level|severity|lvl|loglevel)=\"?([a-zA-Z]+)", re.IGNORECASE)
# a word, not a part of a name: "libgpg-error-dev", "/var/log/errors/", "on_failure.py" say
# nothing of trouble (a package, a path, a file), "error:" and "failed." do
_BEFORE, _AFTER = r"(?<![\w\-./])", r"(?![\w\-/]|\.\w)"
_CRITICAL_WORDS = re.compile(
    _BEFORE + r"(?:panic|segfault|segmentation fault|core dumped|out of memory|oom-killer"
    r"|killed process)" + _AFTER,
    re.IGNORECASE,
)
_ERROR_WORDS = re.compile(
    _BEFORE + r"(?:errors?|fail(?:s|ed|ure|ing)?|denied|refused|exception|traceback|unreachable"
    r"|corrupt(?:ed|ion)?|abort(?:ed|ing)?|timed out|unable to|cannot|can't)" + _AFTER,
    re.IGNORECASE,
)
_WARNING_WORDS = re.compile(
    _BEFORE + r"(?:warn(?:ing)?s?|deprecated|retry(?:ing)?|invalid)" + _AFTER, re.IGNORECASE
)
# words that say the program carried on past the trouble it reports: a fallback taken, a
# delivery deferred, a retry to come ("unable to qualify my own domain name -- using short name")
_CARRIES_ON = re.compile(
    r"\b(?:falling back|falls? back to|will retry|trying again|deferred)\b|(?:^|\s)--\s+using\b",
    re.IGNORECASE,
)
# the program a line comes from: the first word that ends with a colon, its pid cut ("sshd[12]:")
_PROGRAM = re.compile(r"(?:^|\s)([A-Za-z][\w.@/-]*?)(?:\[\d+\])?:(?=\s|$)")
LEVEL_SCAN_TOKENS = 12  # a level token is looked for among the first tokens only


def severity_of(line: str) -> Severity:
    return read_severity(line)[0]


def read_severity(line: str) -> tuple[Severity, bool]:
    """The line's severity, and whether the line states it (a syslog priority or a level token)
    rather than its words suggesting it: "policy-rc.d denied execution" is not a program saying
    ERROR."""
    pri = _SYSLOG_PRI.match(line)
    if pri:
        value = int(pri.group(1)) % 8
        return (
            Severity.CRITICAL
            if value <= 2
            else Severity.ERROR
            if value == 3
            else Severity.WARNING
            if value == 4
            else Severity.INFO
        ), True
    stated = stated_level(line)
    if stated is not None:
        return stated, True
    if _CRITICAL_WORDS.search(line):
        return Severity.CRITICAL, False
    if _ERROR_WORDS.search(line):
        return Severity.ERROR, False
    if _WARNING_WORDS.search(line):
        return Severity.WARNING, False
    return Severity.INFO, False


def carries_on(line: str) -> bool:
    """The line says its program went on past the trouble: "falling back to", "deferred", "will
    retry". Such a failure, where only the line's words say it, is handled, not news to page."""
    return _CARRIES_ON.search(line) is not None


def program_of(line: str) -> str:
    """The program that wrote the line, where the line names it before a colon among its first
    words ("debconf:", "sendmail[4306]:"); "" where it names none."""
    head = " ".join(line.split()[:LEVEL_SCAN_TOKENS])
    found = _PROGRAM.search(head)
    return found.group(1) if found else ""


def stated_level(line: str) -> Severity | None:
    """A level the line states: an upper-case level word, or any case in brackets (`[error]`),
    before a colon (`error:`) or as `level=...`."""
    kv = _LEVEL_KV.search(line)
    if kv and kv.group(1).lower() in _LEVELS:
        return _LEVELS[kv.group(1).lower()]
    for token in line.split()[:LEVEL_SCAN_TOKENS]:
        bracketed = token[:1] in "[<(" and token[-1:] in "]>):"
        word = token.strip("[]<>():,")
        lower = word.lower()
        if lower not in _LEVELS:
            continue
        if word.isupper() or bracketed or token.endswith(":"):
            return _LEVELS[lower]
    return None
