"""Whether a chat turn may need the past: then its recall searches by meaning (the query's
sentence vector) as well as by words; otherwise by words alone.

Embedding the query costs ~12 ms of CPU here, on the engine thread, before the turn's first
token; every turn that recalled nothing paid it (bench/README.md, "long_chat.py"). A turn that
may need what was said before either asks a question ("What is the network passphrase?") or speaks
of its user or of the conversation ("Remind me of my code", "as we said earlier"). A request that
does neither ("Tell me about tides.", "Explain how glass is made.") is searched by its words
(BM25, ~1 ms), which still recalls a passage that shares them. What this misses: a request that
needs earlier text, in other words than that text, with none of these marks ("Continue the
story.", when the story has left the window and shares no word with it).
"""

from __future__ import annotations

import re

# the user, speaking of themselves (or of a group they are in)
_SELF = frozenset("i i'm im i've ive i'd i'll my mine myself we we're we've our ours".split())
_OBJECT = frozenset({"me", "us"})  # "which figure brings me fortune": yes; "tell me about": no
_ASKING_FOR = frozenset("tell show give let help teach explain write make".split())
# what was said, or when
_BACK = frozenset(
    """said say says told mentioned mention wrote earlier before previously previous remember
    recall remind again ago already above forgot forget""".split()
)
# how a question opens, where it has no question mark
_OPENS_A_QUESTION = frozenset(
    """what which who whom whose where when why how is are was were do does did can could would
    will should have has""".split()
)
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")


def may_need_the_past(message: str) -> bool:
    """True when the message asks a question or speaks of its user or of what was said (see the
    module)."""
    if "?" in message:
        return True
    words = _WORD.findall(message.lower().replace("\u2019", "'"))
    if words and words[0] in _OPENS_A_QUESTION:
        return True
    for i, w in enumerate(words):
        if w in _SELF or w in _BACK:
            return True
        if w in _OBJECT and not (i > 0 and words[i - 1] in _ASKING_FOR):
            return True
    return False
