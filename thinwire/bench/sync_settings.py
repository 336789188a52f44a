"""The per-step synchronisation settings a benchmark passes to thinwire's algorithms, read from
`thinwire train`'s declarations (``thinwire.train.settings``): one type, range, default and
help for each, and the same rule for which algorithms use it.

A benchmark that times several algorithms in one run gives each only the settings it uses
(``for_algorithm``), and refuses a value no timed algorithm would use (``refuse_unused``), as
`thinwire train` refuses ``--density`` with allreduce.
"""

from __future__ import annotations

from types import SimpleNamespace

from thinwire.cliargs import add_declared, refuse_unused as refuse

# the settings of thinwire's per-step algorithms that SyncState takes
NAMES = ("density", "selector", "wire", "sparse_wire")


def _declared(name: str):
    from thinwire.train.settings import BY_NAME

    return BY_NAME[name]


def _uses(name: str, algorithm: str) -> bool:
    setting = _declared(name)
    return setting.applies is None or setting.applies(SimpleNamespace(algorithm=algorithm))


def add(parser, names=NAMES, defaults: dict | None = None) -> None:
    """One option per setting, as `thinwire train` declares it (``defaults``: a benchmark's
    own, where it differs)."""
    for name in names:
        setting = _declared(name)
        add_declared(parser, setting, default=(defaults or {}).get(name, setting.default))


def checked(values: dict | None) -> dict:
    """Every setting of NAMES, each checked as `thinwire train` checks it (train's default
    where not given); a name outside NAMES is refused."""
    values = dict(values or {})
    unknown = sorted(set(values) - set(NAMES))
    if unknown:
        raise ValueError(f"sync: unknown settings {unknown}; allowed: {', '.join(NAMES)}")
    return {name: _declared(name).checked(values.get(name, _declared(name).default))
            for name in NAMES}


def checked_algorithm_options(options: dict | None, algorithms) -> dict:
    """{algorithm: {name: value}}, each checked against the algorithm's declaration; an
    algorithm the benchmark does not time is refused."""
    from thinwire import collectives

    options = dict(options or {})
    for name, given in options.items():
        if name not in algorithms:
            raise ValueError(f"algorithm_options names {name!r}, which is not one of the "
                             f"algorithms timed ({', '.join(algorithms)})")
        collectives.get(name).check_options(given)
    return options


def for_algorithm(algorithm: str, values: dict) -> dict:
    """SyncState's keyword arguments for ``algorithm``: the settings it uses, "none" wire as
    None."""
    out = {name: value for name, value in values.items() if _uses(name, algorithm)}
    if out.get("wire") == "none":
        out["wire"] = None
    return out


def refuse_unused(args, algorithms, names=NAMES, defaults: dict | None = None) -> None:
    """A setting given a value where no timed algorithm uses it is refused by name."""
    rules = []
    for name in names:
        setting = _declared(name)
        rules.append((setting.cli_flag, name, (defaults or {}).get(name, setting.default),
                      any(_uses(name, a) for a in algorithms), setting.applies_text))
    refuse(args, rules)
