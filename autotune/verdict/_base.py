"""What a verdict rule is, and the two ways a family of rules is read.

A rule has a name, says when it applies to a case (the figures it judges, with the
evidence gathered so far), and what it concludes; the lines it adds to the case's
evidence are its evidence. A family is a tuple of rules, written once, in the order it is
read:

    first(RULES, case)   the first rule that applies decides (the job's bottleneck:
                         autotune.verdict.rules)
    every(RULES, case)   every rule that applies adds its finding (the storage under a
                         dataset: autotune.verdict.storage, for `autotune probe`)

A new rule is one module beside the others and one place in its family's tuple. Imports
nothing: the probe, a floor below the job's engine, reads its storage through it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar, Generic, TypeVar

C = TypeVar("C")    # the case a family judges
T = TypeVar("T")    # what its rules conclude


class Rule(Generic[C, T]):
    """One rule: `name`, `applies(case)`, `conclude(case)` (which also adds the rule's
    evidence to the case)."""

    name: ClassVar[str] = ""

    def applies(self, case: C) -> bool:
        """Whether the rule speaks on this case (the last rule of a `first` family: always)."""
        return True

    def conclude(self, case: C) -> T:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<rule {self.name}>"


def first(rules: Iterable[Rule[C, T]], case: C) -> tuple[Rule[C, T], T]:
    """The first rule that applies, and what it concludes."""
    for rule in rules:
        if rule.applies(case):
            return rule, rule.conclude(case)
    raise LookupError("no rule of the family applies: its last rule must apply to every case.")


def every(rules: Iterable[Rule[C, T]], case: C) -> list[T]:
    """What each rule that applies concludes, in the family's order."""
    return [rule.conclude(case) for rule in rules if rule.applies(case)]


__all__ = ["Rule", "every", "first"]
