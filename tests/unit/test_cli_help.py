"""Every option of every `thinwire` command says what it does and shows its default in --help."""

from __future__ import annotations

import argparse
import re

import pytest

from thinwire.cli import build_parser


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ("thinwire",)):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, path + (name,))


COMMANDS = list(_commands(build_parser()))
NOT_DEFAULTED = (argparse._HelpAction, argparse._VersionAction)


@pytest.mark.parametrize("path,parser", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_every_option_has_help_and_shows_its_default(path, parser):
    formatter = parser._get_formatter()
    for action in parser._actions:
        if not action.option_strings or isinstance(action, NOT_DEFAULTED) or action.required:
            continue
        assert action.help, f"{' '.join(path)} {action.option_strings[-1]}: no help text"
        shown = formatter._expand_help(action)
        assert "default" in shown, f"{' '.join(path)} {action.option_strings[-1]}: {shown!r}"


def test_defaults_read_as_words_not_python_values():
    text = dict((" ".join(p), q) for p, q in COMMANDS)["thinwire bench sync"].format_help()
    flat = " ".join(text.split())
    assert "(default: off)" in flat  # --no-shaping, a flag
    assert "(default: not set)" in flat  # --json
    assert "None" not in flat and "False" not in flat


def test_hand_laid_out_examples_keep_their_lines():
    text = dict((" ".join(p), q) for p, q in COMMANDS)["thinwire simulate"].format_help()
    example = next(line for line in text.splitlines() if "--model resnet50" in line)
    # the example's line break survives (no backslash-newline joining the two lines into one
    # with a run of spaces in the middle)
    assert not re.search(r"\S {3,}\S", example), example
