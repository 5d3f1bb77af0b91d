"""Command-line flags generated from a pydantic model's fields (the stage schema, `StageConfig`).

One declaration per setting: a field's type gives the flag's type (an enum or `Literal` gives
its choices, a bool gives `--x/--no-x`), its docstring gives the help text, its paper symbol
(the second choice of its `AliasChoices`, e.g. `T`, `D_R`, `tgt_ent`) gives extra spellings,
and its default is shown but never passed: a flag left out is left out of the result, so the
schema's own default (or a file's value) applies. Nested models (`entropy`) get prefixed flags
(`--entropy-target`, also `--tgt-ent`); optional nested models (`plateau`) and lists are left to
files. New fields of the schema get flags without any change here.

    add_model_flags(parser, StageConfig, dest_prefix="stage")
    overrides = model_overrides(args, StageConfig, dest_prefix="stage")   # nested dict of given flags
"""

from __future__ import annotations

import argparse
import enum
import types
import typing
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ValidationError
from pydantic.fields import FieldInfo

_SCALARS = (int, float, str)


def _unwrap_optional(annotation: Any) -> tuple[Any, bool]:
    """(T, True) for `T | None`, else (annotation, False)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return annotation, False


def _symbols(field: FieldInfo, name: str) -> list[str]:
    """The paper's symbols a field is also accepted as (its other validation aliases)."""
    alias = field.validation_alias
    choices = alias.choices if isinstance(alias, AliasChoices) else []
    return [c for c in choices if isinstance(c, str) and c != name]


def _option_strings(name: str, symbols: list[str], prefix: str) -> list[str]:
    """`--context-length --T`, `--entropy-target --tgt_ent --tgt-ent`: the field's name, its
    symbols as written, and their lowercase dashed form where it differs (`--delta`)."""
    opts = ["--" + (prefix + name).replace("_", "-")]
    for s in symbols:
        for opt in ("--" + s, "--" + s.replace("_", "-").lower() if any(c.islower() for c in s) else None):
            if opt and opt not in opts:
                opts.append(opt)
    return opts


def _flag_kind(annotation: Any) -> tuple[type | None, list[str] | None]:
    """(argparse type, choices) of a scalar annotation; (None, None) when it has no flag."""
    inner, _ = _unwrap_optional(annotation)
    if isinstance(inner, type) and issubclass(inner, enum.Enum):
        return str, [str(m.value) for m in inner]
    if typing.get_origin(inner) is Literal:
        values = typing.get_args(inner)
        if all(isinstance(v, str) for v in values):
            return str, list(values)
        return None, None
    if inner is bool:
        return bool, None
    if inner in _SCALARS:
        return inner, None
    return None, None


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _help(field: FieldInfo, defaults: dict, name: str) -> str:
    text = " ".join((field.description or name.replace("_", " ")).split())
    text = text.replace("%", "%%")
    default = defaults.get(name, field.get_default(call_default_factory=False) if not field.is_required() else None)
    if field.is_required() and name not in defaults:
        return f"{text} (required)"
    if isinstance(default, enum.Enum):
        default = default.value
    return f"{text} (default: {default})"


def add_model_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    model: type[BaseModel],
    dest_prefix: str,
    defaults: dict[str, Any] | None = None,
    skip: frozenset[str] = frozenset(),
    _name_prefix: str = "",
) -> None:
    """One flag per scalar field of `model` (recursing into nested models). `defaults` only
    changes the default shown in the help (the caller applies it); `skip` leaves fields out."""
    defaults = defaults or {}
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        dest = f"{dest_prefix}__{name}"
        nested = _nested_model(field.annotation)
        if nested is not None:
            sub = defaults.get(name) if isinstance(defaults.get(name), dict) else {}
            add_model_flags(parser, nested, dest, sub, frozenset(), f"{_name_prefix}{name}_")
            continue
        kind, choices = _flag_kind(field.annotation)
        if kind is None:
            continue
        opts = _option_strings(name, _symbols(field, name), _name_prefix)
        help_text = _help(field, defaults, name)
        if kind is bool:
            parser.add_argument(*opts, dest=dest, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            metavar = "{" + ",".join(choices) + "}" if choices else (_symbols(field, name) or [name])[0].upper()
            parser.add_argument(*opts, dest=dest, type=kind, choices=choices, default=None, metavar=metavar, help=help_text)


def model_overrides(args: argparse.Namespace, model: type[BaseModel], dest_prefix: str) -> dict[str, Any]:
    """The fields whose flags were given, as a (nested) dict keyed by field name."""
    out: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        dest = f"{dest_prefix}__{name}"
        nested = _nested_model(field.annotation)
        if nested is not None:
            sub = model_overrides(args, nested, dest)
            if sub:
                out[name] = sub
            continue
        value = getattr(args, dest, None)
        if value is not None:
            out[name] = value
    return out


def canonical(model: type[BaseModel], data: dict[str, Any]) -> dict[str, Any]:
    """`data` with the paper's symbols replaced by field names (`T` -> `context_length`), also
    for nested models whose symbols may be given flat (`tgt_ent` -> `entropy.target`)."""
    out = dict(data)
    for name, field in model.model_fields.items():
        for symbol in _symbols(field, name):
            if symbol in out and name not in out:
                out[name] = out.pop(symbol)
        nested = _nested_model(field.annotation)
        if nested is None:
            continue
        sub = canonical(nested, out[name]) if isinstance(out.get(name), dict) else {}
        for sub_name, sub_field in nested.model_fields.items():
            for symbol in _symbols(sub_field, sub_name):
                if symbol in out and sub_name not in sub:
                    sub[sub_name] = out.pop(symbol)
        if sub or isinstance(out.get(name), dict):
            out[name] = sub
    return out


def merge(model: type[BaseModel], base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`base` with `overrides` applied field by field (a flag overrides one field of `entropy`,
    not the whole group); either may be spelled with the paper's symbols (a file's stage)."""
    out = canonical(model, base)
    for key, value in canonical(model, overrides).items():
        nested = _nested_model(model.model_fields[key].annotation) if key in model.model_fields else None
        if isinstance(value, dict) and nested is not None and isinstance(out.get(key), dict):
            out[key] = merge(nested, out[key], value)
        else:
            out[key] = value
    return out


def flag_of(model: type[BaseModel], loc: tuple | list) -> str | None:
    """The flag of the field at `loc` (a pydantic error's location) of `model`, as `add_model_flags`
    names it (`--rollout-batch-size/--D_R`), or None when `loc` is no field of it."""
    prefix, current = "", model
    for i, part in enumerate(loc):
        field = current.model_fields.get(str(part)) if isinstance(current, type) else None
        if field is None:
            return None
        nested = _nested_model(field.annotation)
        if nested is None or i == len(loc) - 1:
            return "/".join(_option_strings(str(part), _symbols(field, str(part)), prefix)[:2])
        prefix, current = f"{prefix}{part}_", nested
    return None


def describe_errors(exc: ValidationError, model: type[BaseModel]) -> str:
    """A pydantic error of `model` as the user's flags: one line a problem, named by its flag, with
    the value given and no documentation URL (``--rollout-batch-size/--D_R: Input should be greater
    than or equal to 1, got 0``)."""
    lines = []
    for err in exc.errors(include_url=False):
        where = flag_of(model, err["loc"]) or ".".join(str(x) for x in err["loc"]) or model.__name__
        got = err.get("input")
        shown = f", got {got!r}" if isinstance(got, (int, float, str, bool)) and err["loc"] else ""
        lines.append(f"{where}: {err['msg'].removeprefix('Value error, ')}{shown}")
    return "\n".join(lines)
