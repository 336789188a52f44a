"""Declared settings: one :class:`Option` per setting, read by every place that takes it.

An algorithm (``thinwire.collectives.registry.Algorithm(options=...)``) or a transport lists
its settings once, with name, type, range, default and help. From that one declaration:

* ``check_options(owner, declared, given)`` refuses an unknown name (listing the allowed ones),
  checks every value against its range and fills in the defaults: what ``SyncState``, the
  simulator and the checkpoint identity use;
* ``Option.parse(text)`` turns command-line text into the declared type (``thinwire train``,
  ``compare``, ``bench sync`` and ``simulate`` take ``--algorithm-option ALGORITHM:NAME=VALUE``);
* ``Option.allowed()`` is what the help text and every error message say it takes.

Values are plain JSON types (int, float, bool, str, or None where ``optional``), so a
configuration file, a checkpoint and a command line all hold the same thing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["Option", "check_options", "unknown_option"]

_TYPES = (int, float, bool, str)


@dataclass(frozen=True)
class Option:
    """One setting. ``low``/``high`` bound numbers (``low_open``/``high_open``: the bound itself
    excluded); ``choices`` lists a string's values (or is a function returning them, read when
    checked: a registry's names); ``optional``: None is allowed and means "automatic" (what
    ``help`` says)."""

    name: str
    type: type
    default: Any
    help: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    choices: Any = None
    optional: bool = False
    high_open: bool = False

    def __post_init__(self):
        if not self.name.isidentifier():
            raise ValueError(f"Option name must be an identifier, got {self.name!r}")
        if self.type not in _TYPES:
            raise TypeError(f"Option {self.name!r}: type must be one of int, float, bool, str, "
                            f"got {self.type!r}")
        if self.choices is not None and self.type is not str:
            raise TypeError(f"Option {self.name!r}: choices are for str options")
        if not callable(self.choices):  # registries fill theirs later: checked when used
            self.check(self.default, "the default of")  # a declaration that contradicts itself

    def allowed_choices(self) -> tuple[str, ...] | None:
        return tuple(self.choices()) if callable(self.choices) else self.choices

    def allowed(self) -> str:
        """What the option takes, in words (the second half of every error message)."""
        if self.type is bool:
            text = "true or false"
        elif self.type is str:
            choices = self.allowed_choices()
            text = f"one of {', '.join(choices)}" if choices else "a string"
        else:
            kind = "an integer" if self.type is int else "a number"
            if self.low is not None and self.high is not None:
                text = (f"{kind} in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}"
                        f"{')' if self.high_open else ']'}")
            elif self.low is not None:
                text = f"{kind} {'>' if self.low_open else '>='} {self.low:g}"
            elif self.high is not None:
                text = f"{kind} {'<' if self.high_open else '<='} {self.high:g}"
            else:
                text = f"a finite {kind[3:] if kind.startswith('an ') else kind[2:]}"
        return text + (" or none" if self.optional else "")

    def check(self, value, owner: str | None = None, label: str | None = None) -> Any:
        """``value`` if the option takes it (an int where a float is declared becomes a
        float); else a ValueError naming the option (as ``label``, e.g. a command-line flag,
        or as ``owner``'s option), the value and what is allowed."""
        if value is None and self.optional:
            return None
        if self._fits(value):
            return float(value) if self.type is float else value
        name = label if label is not None else f"{owner} option {self.name!r}"
        raise ValueError(f"{name} must be {self.allowed()}, got {value!r}")

    def _fits(self, value) -> bool:
        if self.type is bool:
            return isinstance(value, bool)
        if self.type is str:
            choices = self.allowed_choices()
            return isinstance(value, str) and (choices is None or value in choices)
        if isinstance(value, bool) or not isinstance(value, (int, float) if self.type is float
                                                     else int):
            return False
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def parse(self, text: str, owner: str | None = None, label: str | None = None) -> Any:
        """Command-line ``text`` as the declared type, checked (``none`` for an optional
        setting's automatic value)."""
        if self.optional and text.lower() == "none":
            return None
        value: Any = text
        if self.type is bool:
            value = {"true": True, "false": False}.get(text.lower(), text)
        elif self.type in (int, float):
            try:
                value = self.type(text)
            except ValueError:
                value = text
        return self.check(value, owner, label)


def unknown_option(owner: str, declared: tuple[Option, ...], names: list[str]) -> ValueError:
    """The error for settings ``owner`` does not declare, listing the ones it does."""
    allowed = ", ".join(o.name for o in declared) or "none (it takes no options)"
    return ValueError(f"{owner} takes no option {', '.join(map(repr, names))}; its options: "
                      f"{allowed}")


def check_options(owner: str, declared: tuple[Option, ...], given) -> dict:
    """``given`` (a dict of name -> value, or None) checked against ``declared``, with every
    default filled in. An unknown name is refused with the allowed ones."""
    if given is None:
        given = {}
    if not isinstance(given, dict):
        raise ValueError(f"{owner} options must be a dict of name -> value, got {given!r}")
    by_name = {option.name: option for option in declared}
    unknown = sorted(str(name) for name in set(given) - set(by_name))
    if unknown:
        raise unknown_option(owner, declared, unknown)
    return {name: option.check(given.get(name, option.default), owner)
            for name, option in by_name.items()}


def checked_as_flags(build, fields, renames: dict[str, str] | None = None):
    """``build()`` (a config object whose checks name its fields, e.g. ``node_memory must
    be ...``), with a ValueError re-raised under the command-line flag the user typed
    (``--node-memory must be ...``): the same check, said in the user's words. ``fields``:
    the config's field names; ``renames``: fields whose flag is not ``--`` + the name with
    dashes (``failure_schedule`` is ``--fail``)."""
    try:
        return build()
    except ValueError as exc:
        message = str(exc)
        for field in sorted(fields, key=len, reverse=True):
            if message.startswith(field) and not message[len(field):][:1].isalnum() \
                    and message[len(field):][:1] != "_":
                flag = (renames or {}).get(field, "--" + field.replace("_", "-"))
                raise ValueError(flag + message[len(field):]) from None
        raise
