"""The engine's command-line flags, built from :class:`~engine.config.EngineConfig`'s own fields.

Each field is one flag (``max_num_seqs`` is ``--max-num-seqs``); its help, choices and grouping
come from the field's metadata, so a new config field is a new flag on every command that starts
an engine (``generate``, ``serve``, ``diagnose``, ``bench``) with nothing else to edit.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any, Literal

from engine.config import EngineConfig

_FIELDS = dataclasses.fields(EngineConfig)


def _value_type(annotation: Any) -> tuple[type, tuple[Any, ...] | None]:
    """``(the type argparse converts to, its choices)`` of one field's annotation."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return _value_type(args[0])
    if origin is Literal:
        return type(args[0]), tuple(args)
    return annotation, None


def _flag_name(field: dataclasses.Field[Any]) -> str:
    return "--" + field.name.replace("_", "-")


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """Engine flags, the same on every command that starts an engine; ``dest`` is the field's name."""
    group = parser.add_argument_group("engine")
    exclusive: dict[str, Any] = {}
    hints = typing.get_type_hints(EngineConfig)
    for field in _FIELDS:
        meta = field.metadata
        target = group
        if "exclusive" in meta:
            if meta["exclusive"] not in exclusive:
                exclusive[meta["exclusive"]] = group.add_mutually_exclusive_group()
            target = exclusive[meta["exclusive"]]
        kind, choices = _value_type(hints[field.name])
        if kind is bool:
            # NOTE: a default-true switch is turned off by its negative flag; a default-false one on by its own.
            flag = meta["negative"] if field.default else _flag_name(field)
            help_text = f"turn off: {meta['help']} (on by default)" if field.default else meta["help"]
            target.add_argument(flag, dest=field.name, action="store_false" if field.default else "store_true",
                                help=help_text)
            continue
        choices = meta.get("choices", choices)
        default_text = "" if field.default is None else f" (default {field.default})"
        target.add_argument(_flag_name(field), dest=field.name, type=kind, default=field.default,
                            choices=choices, help=meta["help"] + default_text)


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """The config the parsed engine flags describe."""
    return EngineConfig(**{field.name: getattr(args, field.name) for field in _FIELDS})


def engine_argv(args: argparse.Namespace) -> list[str]:
    """The engine flags of ``args`` as a command line (what another process parses back to the same config)."""
    argv: list[str] = []
    for field in _FIELDS:
        value = getattr(args, field.name)
        if isinstance(value, bool):
            if value != field.default:
                argv.append(field.metadata["negative"] if field.default else _flag_name(field))
        elif value is not None:
            argv += [_flag_name(field), str(value)]
    return argv
