"""Frozen dataclass records built past their generated __init__, for the per-period hot paths.

A frozen dataclass's __init__ sets each field through object.__setattr__, about half of what
making one costs; the growth gate makes a CallDecision per live call and sandbox admission a
SandboxDecision per queued create, every period.
"""

from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T")


def frozen(cls: type[T], **fields: Any) -> T:
    """cls(**fields) without its __init__: the same object for a frozen dataclass without
    __post_init__, __slots__ or init=False fields, every field given by name (the tests compare
    each class built here with its constructor's)."""
    obj = object.__new__(cls)
    obj.__dict__.update(fields)
    return obj
