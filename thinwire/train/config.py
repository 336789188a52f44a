"""One training run's configuration: plain values, checked once, shared by the command line.

Its settings are declared in :mod:`thinwire.train.settings`; `add_arguments(parser)` builds the
options of `thinwire train`, `python -m thinwire.train` and `thinwire compare` from them, so
the entry points take exactly the same options with the same checks.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict, field, fields, make_dataclass

from thinwire import collectives
from thinwire.cliargs import add_algorithm_option, options_by_algorithm
from thinwire.output import read_json
from thinwire.train import models, modes, quality, settings

# One declaration per setting: thinwire.train.settings (type, range, default, help, the runs
# it applies to). TrainConfig's fields, the command line and the checks are read from there.
MAX_LR = settings.MAX_LR


def _validate(self) -> "TrainConfig":
    """Every value against its declaration (named by its flag), then the mode's rules, the
    settings the run would ignore, and the relations between settings. Returns self."""
    for setting in settings.SETTINGS:
        setattr(self, setting.name, setting.checked(getattr(self, setting.name)))
    modes.mode_of(self.algorithm).check(self)
    settings.refuse_inapplicable(self)
    self.algorithm_options = modes.check_algorithm_options(self)
    for name in ("checkpoint", "resume"):
        path = getattr(self, name)
        if path is not None and os.path.exists(path) and not os.path.isdir(path):
            raise ValueError(f"--{name} must be a directory (one file per rank inside), "
                             f"got {path!r}, which is a file")
    if self.density_warmup_steps and not self.density <= self.density_warmup_from:
        raise ValueError(f"--density-warmup-from must be a number in [--density, 1] = "
                         f"[{self.density:g}, 1], got {self.density_warmup_from!r}")
    if self.momentum_correction and self.amp == "fp16":
        raise ValueError("--momentum-correction cannot be used with --amp fp16: the hook's "
                         "velocities would hold loss-scaled (and, on overflow, inf) "
                         "gradients; use --amp bf16 or none")
    if self.momentum_correction and self.optimizer != "sgd":
        raise ValueError(f"--momentum-correction needs --optimizer sgd (its momentum moves into "
                         f"the hook), got --optimizer {self.optimizer}")
    if self.target_bits_per_byte is not None:
        quality.check_target("bits_per_byte", self.target_bits_per_byte,
                             "--target-bits-per-byte")
        if models.data_name(self.model) != "stdlib_text":
            raise ValueError(f"--target-bits-per-byte needs a language model (transformer),"
                             f" got --model {self.model}")
    if self.target_accuracy is not None and self.target_bits_per_byte is not None:
        raise ValueError("give --target-accuracy or --target-bits-per-byte, not both")
    if self.stop_at_target and self.target_accuracy is None \
            and self.target_bits_per_byte is None:
        raise ValueError("--stop-at-target needs --target-accuracy or --target-bits-per-byte")
    if self.checkpoint_every and not self.checkpoint:
        raise ValueError("--checkpoint-every needs --checkpoint DIR (where to write it)")
    if self.resume_if_present and not self.checkpoint:
        raise ValueError("--resume-if-present needs --checkpoint DIR (where to look)")
    if self.resume_if_present and self.resume:
        raise ValueError(f"give --resume {self.resume} or --resume-if-present, not both")
    if self.stop_after and not self.checkpoint:
        raise ValueError("--stop-after needs --checkpoint DIR (to resume from later)")
    if self.waves == 2:
        from thinwire.wavelet.schedule import check_train_config
        check_train_config(self)
    if self.fault_tolerant:
        from thinwire.train.ft_check import check_train_config as check_fault_tolerant
        check_fault_tolerant(self)
    return self


def _to_dict(self) -> dict:
    return asdict(self)


TrainConfig = make_dataclass(
    "TrainConfig",
    [(s.name, s.type if not s.optional else (s.type | None), field(default=s.default))
     for s in settings.SETTINGS]
    + [("algorithm_options", dict, field(default_factory=dict))],
    namespace={"validate": _validate, "to_dict": _to_dict,
               "__doc__": "One training run's settings: thinwire.train.settings declares each "
                          "(type, range, default, help); algorithm_options is {algorithm: "
                          "{name: value}} of the registry's declared algorithm options. "
                          "validate() checks them all and returns the config."})
TrainConfig.__module__ = __name__  # make_dataclass names its caller's module only from 3.12


def _cli_type(setting: settings.Setting):
    """An argparse type: the text as the setting's type (the range is checked in validate,
    with the same message from the command line and from Python)."""
    def parse(text: str):
        if setting.optional and text.lower() == "none" and setting.type is not str:
            return None
        try:
            return setting.type(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {setting.allowed()}, got {text!r}") \
                from None
    parse.__name__ = setting.type.__name__
    return parse


def add_arguments(parser: argparse.ArgumentParser, exclude: tuple = ()) -> None:
    """The training options, one per declared setting; ``exclude``: setting names to leave
    out (`thinwire compare` sets those per run itself)."""
    for setting in settings.SETTINGS:
        if setting.name in exclude:
            continue
        kwargs = dict(dest=setting.name, default=setting.default,
                      help=f"{setting.help} ({setting.allowed()}"
                           f"{'; ' + setting.applies_text if setting.applies_to else ''})")
        if setting.type is bool:
            kwargs.update(action="store_false" if setting.negate else "store_true",
                          help=setting.help + (f" ({setting.applies_text})"
                                               if setting.applies_to else ""))
        else:
            kwargs.update(type=_cli_type(setting), metavar=setting.metavar)
        parser.add_argument(setting.cli_flag, **kwargs)
    if "algorithm_options" not in exclude:
        add_algorithm_option(parser)


def add_config_file(parser: argparse.ArgumentParser, argv: list[str] | None) -> None:
    """``--config FILE``: a JSON object of TrainConfig fields that becomes the parser's
    defaults, so options given on the command line still win (how `thinwire compare` hands a
    run its whole configuration)."""
    import sys

    parser.add_argument("--config", default=None, metavar="FILE",
                        help="JSON object of training settings (command-line options win)")
    known, _ = parser.parse_known_args(argv if argv is not None else sys.argv[1:])
    if known.config:
        values = read_json(known.config, "--config file")
        names = {f.name for f in fields(TrainConfig)}
        unknown = sorted(set(values) - names) if isinstance(values, dict) else []
        if not isinstance(values, dict) or unknown:
            raise ValueError(f"--config {known.config}: not a JSON object of training settings "
                             f"(unknown keys: {unknown})")
        parser.set_defaults(**values)


def algorithm_options(args: argparse.Namespace) -> dict:
    """{algorithm: {name: value}}: a --config file's algorithm_options with the command
    line's --algorithm-option values over them."""
    merged = {name: dict(values) for name, values in
              (getattr(args, "algorithm_options", None) or {}).items()}
    for name, values in options_by_algorithm(getattr(args, "algorithm_option", None) or [],
                                             collectives.names()).items():
        merged.setdefault(name, {}).update(values)
    return merged


def from_args(args: argparse.Namespace) -> TrainConfig:
    names = {f.name for f in fields(TrainConfig)}
    values = {k: v for k, v in vars(args).items() if k in names}
    values["algorithm_options"] = algorithm_options(args)
    return TrainConfig(**values).validate()
