"""Checked command-line values: argparse types that refuse what a command cannot use, and output
paths checked before the work starts.

An argparse ``type=`` that raises `argparse.ArgumentTypeError` ends the command with
``error: argument --epochs: must be an integer >= 1, got '0'`` (the parameter, the value and
what is allowed), never a traceback halfway through, nor a value accepted silently.
"""

from __future__ import annotations

import argparse
import math

from thinwire.output import OutputPathError, check_output_path

__all__ = ["OutputPathError", "add_algorithm_option", "add_declared", "algorithm_option",
           "check_output_path", "device", "integer", "number", "options_by_algorithm",
           "refuse_unused"]

_DECLARED = object()  # add_declared's "the declaration's default"


def integer(low: int, high: int | None = None):
    """An argparse type: an integer in [low, high]."""
    allowed = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {allowed}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {allowed}, got {text!r}")
        return value
    parse.__name__ = "integer"
    return parse


def number(low: float | None = None, high: float | None = None, *, low_open: bool = False,
           high_open: bool = False):
    """An argparse type: a finite float in the given interval (open or closed at each end)."""
    left = "(" if low_open else "["
    right = ")" if high_open else "]"
    allowed = (f"a finite number in {left}{'-inf' if low is None else f'{low:g}'}, "
               f"{'inf' if high is None else f'{high:g}'}{right}")

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {allowed}, got {text!r}") from None
        bad = (not math.isfinite(value)
               or (low is not None and (value <= low if low_open else value < low))
               or (high is not None and (value >= high if high_open else value > high)))
        if bad:
            raise argparse.ArgumentTypeError(f"must be {allowed}, got {text!r}")
        return value
    parse.__name__ = "number"
    return parse


def algorithm_option(text: str) -> tuple[str, str, object]:
    """An argparse type: ``ALGORITHM:NAME=VALUE``, one of an algorithm's declared settings
    (``thinwire.collectives.registry.Algorithm.options``), parsed as its declared type and
    checked against its range here, before anything launches. ``none`` is an optional
    setting's automatic value."""
    from thinwire import collectives

    head, sep, raw = text.partition("=")
    algorithm, colon, name = head.partition(":")
    if not (sep and colon and algorithm and name.isidentifier()):
        raise argparse.ArgumentTypeError(f"must be ALGORITHM:NAME=VALUE (e.g. oktopk:tau=16), "
                                         f"got {text!r}")
    try:
        option = collectives.get(algorithm, "ALGORITHM").option(name)
        return algorithm, name, option.parse(raw, f"algorithm {algorithm!r}")
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_algorithm_option(parser) -> None:
    """``--algorithm-option ALGORITHM:NAME=VALUE`` (repeatable): what every command that runs
    an algorithm takes for its declared settings (``thinwire.collectives`` registry)."""
    from thinwire import collectives

    parser.add_argument(
        "--algorithm-option", dest="algorithm_option", action="append", default=None,
        type=algorithm_option, metavar="ALGORITHM:NAME=VALUE",
        help="one of an algorithm's own settings, repeatable; "
             + "; ".join(f"{a.name}: " + ", ".join(
                 f"{o.name} ({o.allowed()}, default "
                 f"{'automatic' if o.default is None else o.default})" for o in a.options)
                 for a in map(collectives.get, collectives.names()) if a.options))


def options_by_algorithm(items: list[tuple[str, str, object]], algorithms: list[str],
                         flag: str = "--algorithm-option") -> dict[str, dict]:
    """``algorithm_option`` values grouped by algorithm; an algorithm not run, or a setting
    given twice, is refused by name."""
    out: dict[str, dict] = {}
    for algorithm, name, value in items:
        if algorithm not in algorithms:
            raise ValueError(f"{flag} {algorithm}:{name}: {algorithm!r} is not one of the "
                             f"algorithms run ({', '.join(algorithms)})")
        if name in out.setdefault(algorithm, {}):
            raise ValueError(f"{flag} {algorithm}:{name} is given twice")
        out[algorithm][name] = value
    return out


def add_declared(parser, option, *, flag: str | None = None, dest: str | None = None,
                 default=_DECLARED, help_prefix: str = "") -> None:
    """One command-line option read from a declared setting (``thinwire.options.Option``: an
    algorithm's, a transport's, or a training setting of ``thinwire.train.settings``): its
    type, range and help come from the declaration, so a benchmark takes the same values with
    the same message as `thinwire train`. ``default``: where a command's own default differs
    (said in its help); ``help_prefix``: which of the command's runs use it."""
    flag = flag or getattr(option, "cli_flag", None) or "--" + option.name.replace("_", "-")
    default = option.default if default is _DECLARED else option.check(default, label=flag)
    shown = "automatic" if default is None else str(default).lower() \
        if isinstance(default, bool) else default
    kwargs = dict(dest=dest or option.name, default=default,
                  help=f"{help_prefix}{option.help}" + ("" if option.type is bool else
                                                        f" ({option.allowed()}; default {shown})"))
    if option.type is bool and not getattr(option, "negate", False):
        kwargs["action"] = "store_true"
    elif option.type is bool:
        kwargs["action"] = "store_false"
    else:
        def parse(text: str):
            try:
                return option.parse(text, label=flag)
            except ValueError as error:
                raise argparse.ArgumentTypeError(str(error).replace(f"{flag} must", "must")) \
                    from None
        parse.__name__ = option.type.__name__
        kwargs.update(type=parse, metavar=getattr(option, "metavar", None))
    parser.add_argument(flag, **kwargs)


def refuse_unused(args, rules) -> None:
    """A value other than the default, given to an option no run of this command uses, is
    refused by name (it would be ignored without a word). ``rules``: (flag, dest, default,
    whether a run uses it, which runs would)."""
    for flag, dest, default, is_used, applies_to in rules:
        value = getattr(args, dest)
        if not is_used and value != default:
            shown = "" if value is True else f" {value}"
            raise ValueError(f"{flag} applies to {applies_to}; no run of this command uses it, "
                             f"got {flag}{shown}")


def device(text: str) -> str:
    """An argparse type: ``cpu``, ``cuda`` or ``cuda:N`` (the devices thinwire runs on)."""
    name, _, index = text.partition(":")
    if name == "cpu" and not index or name == "cuda" and (not index or index.isdigit()):
        return text
    raise argparse.ArgumentTypeError(f"must be cpu, cuda or cuda:N, got {text!r}")


def _describe_default(action: argparse.Action) -> str:
    """How a default reads in --help: flags as off/on, lists space-separated, None as not set."""
    value = action.default
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        text = "on" if value else "off"
    elif value is None:
        text = "not set"
    elif isinstance(value, (list, tuple)):
        text = " ".join(str(v) for v in value)
    else:
        text = str(value)
    return text.replace("%", "%%")  # the help string is %-formatted by argparse


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default (argparse's defaults formatter, with defaults
    that read as words: 'off' rather than False, 'not set' rather than None). A help text that
    already states its default is left as it is."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (not action.option_strings or action.required or action.default is argparse.SUPPRESS
                or "default" in text or isinstance(action, argparse._VersionAction)):
            return text
        return f"{text} (default: {_describe_default(action)})".strip()


class RawDescriptionHelpFormatter(argparse.RawDescriptionHelpFormatter, HelpFormatter):
    """HelpFormatter for commands whose description is laid out by hand (examples)."""


def apply_help_formatter(parser: argparse.ArgumentParser) -> None:
    """Give `parser` and every sub-command below it the defaults-showing formatter, keeping a
    hand-laid-out description where a command asked for one."""
    raw = issubclass(parser.formatter_class, argparse.RawDescriptionHelpFormatter)
    parser.formatter_class = RawDescriptionHelpFormatter if raw else HelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                apply_help_formatter(sub)

