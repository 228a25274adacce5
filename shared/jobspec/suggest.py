""" "Did you mean …": the near match of a mistyped name among the names that would have worked.

One rule for every message that names something the user typed — a spec field, a command-line flag,
a config key, a task, a tracker, a local model, a label — so that each suggests the same way.
Standard library only (difflib's ratio, the measure `python -c` and argparse's own suggestions use),
so the client and the CLI use it without the service's dependencies.
"""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Iterable

# difflib's ratio at which two names count as near: "learing_rate"/"learning_rate" 0.96,
# "sst3"/"sst2" 0.75, "all-MiniLM-L6-v3"/"all-MiniLM-L6-v2" 0.94, "postive"/"positive" 0.93;
# "cola"/"qnli" 0.25 and "postive"/"negative" 0.53 stay apart.
NEAR_RATIO = 0.7
MAX_SUGGESTIONS = 3
TIE = 0.05  # names this close to the nearest one are suggested beside it
# Bounds on one suggestion's work, whatever a request sends: a name longer than any real one is
# suggested nothing (difflib's ratio is quadratic in the worst case), and at most this many
# choices are compared (spec fields, tasks, model folders, a file's labels: no real list nears it).
MAX_WORD_CHARS = 200
MAX_CHOICES = 10_000


def near_matches(word: str, choices: Iterable[str], *, ratio: float = NEAR_RATIO) -> list[str]:
    """The choices nearest to `word` (closest first, at most MAX_SUGGESTIONS), compared without case;
    a choice equal to `word` but for case or surrounding spaces comes first. Only the first
    MAX_CHOICES choices are read; a word over MAX_WORD_CHARS is matched only that way."""
    by_key: dict[str, str] = {}
    for choice in itertools.islice(choices, MAX_CHOICES):
        by_key.setdefault(choice.strip().casefold(), choice)
    key = word.strip().casefold()
    if key in by_key and by_key[key] != word:
        return [by_key[key]]
    if len(key) > MAX_WORD_CHARS:
        return []
    # One matcher for the word, each choice set against it (difflib.get_close_matches' own way):
    # difflib indexes its second sequence, so the word is indexed once, not once per choice.
    matcher = difflib.SequenceMatcher()
    matcher.set_seq2(key)
    scored = []
    for other in by_key:
        if other != key:
            matcher.set_seq1(other)
            if matcher.real_quick_ratio() >= ratio and matcher.quick_ratio() >= ratio:
                scored.append((matcher.ratio(), other))
    scored = sorted((item for item in scored if item[0] >= ratio), reverse=True)
    # Only the nearest ones: "trainr" is "trainer" (0.92), not also "no_trainer" (0.75).
    best = scored[0][0] if scored else 0.0
    return [by_key[other] for score, other in scored[:MAX_SUGGESTIONS] if score >= best - TIE]


def did_you_mean(word: str, choices: Iterable[str], *, prefix: str = "", quote: bool = True) -> str:
    """ "; did you mean 'x'?" (or "'x' or 'y'") for the near matches of `word`, else "". `prefix`
    goes before each name (a flag's "--")."""
    found = near_matches(word, choices)
    if not found:
        return ""
    names = [f"{prefix}{name}" for name in found]
    shown = [repr(name) if quote else name for name in names]
    return f"; did you mean {' or '.join(shown)}?"
