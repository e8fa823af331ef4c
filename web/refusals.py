"""Requests refused by the declared models (web/schemas.py): one 400 line naming the
field, in the API's error format (``{"error": "bad_request", "message": ...}``).

An unknown field is named first, with the fields the model has; a value of the wrong
kind gets the field's hint (:attr:`web.schemas.Input.hints`) or the kind it should be;
a value out of bounds, the bound it broke.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar, get_args

from pydantic import ValidationError
from werkzeug.exceptions import BadRequest

from .schemas import Input

InputT = TypeVar("InputT", bound=Input)


def validated(model: type[InputT], data: Any) -> InputT:
    """``data`` as ``model``; :class:`BadRequest` naming the first refused field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise BadRequest(refusal(model, exc)) from None


#: Errors of a value out of bounds: refused with the bound, not with the field's hint.
_BOUNDS = {
    "too_short",
    "too_long",
    "string_too_short",
    "string_too_long",
    "greater_than",
    "greater_than_equal",
    "less_than",
    "less_than_equal",
}
_KINDS = {
    "missing": "required",
    "bool_type": "true or false",
    "int_type": "a whole number",
    "int_from_float": "a whole number",
    "int_parsing": "a whole number",
    "float_parsing": "a number",
    "float_type": "a number",
    "finite_number": "a finite number",
    "string_type": "text",
    "list_type": "a list",
    "dict_type": "a JSON object",
    "model_type": "a JSON object",
}
_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def refusal(model: type[Input], exc: ValidationError) -> str:
    """One line for the first error of ``exc``: an unknown field first (with the fields
    the body has), else the field with its hint or the rule it broke."""
    errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
    error = errors[0]
    loc = error["loc"]
    if error["type"] == "extra_forbidden":
        owner = _model_at(model, loc[:-1])
        fields = ", ".join(owner.model_fields) or "none"
        return f"{_path(loc)}: {owner.unknown_field} (fields: {fields})"
    hint = model.hints.get(str(loc[0])) if loc else None
    if hint is not None and error["type"] not in _BOUNDS:
        return f"{loc[0]}: {hint}"
    return f"{_path(loc) or 'the body'}: {_said(error)}"


def _said(error: Any) -> str:
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind in _KINDS:
        return _KINDS[kind]
    if kind == "too_short":
        least = ctx.get("min_length", 1)
        return "a non-empty list" if least == 1 else f"at least {least} items"
    if kind == "too_long":
        return f"at most {ctx.get('max_length')} items"
    if kind == "string_too_short":
        least = ctx.get("min_length", 1)
        return "not empty" if least == 1 else f"at least {least} characters"
    if kind == "string_too_long":
        return f"at most {ctx.get('max_length')} characters"
    if kind == "string_pattern_mismatch":
        return f"must match {ctx.get('pattern')}"
    if kind == "literal_error":
        return f"one of {ctx.get('expected')}"
    bounds = {
        "greater_than": ("more than", "gt"),
        "greater_than_equal": ("at least", "ge"),
        "less_than": ("less than", "lt"),
        "less_than_equal": ("at most", "le"),
    }
    if kind in bounds:
        words, name = bounds[kind]
        value = ctx.get(name)
        return f"{words} {value:g}" if isinstance(value, float) else f"{words} {value}"
    return str(error["msg"])


def _path(loc: tuple[Any, ...]) -> str:
    """``jobs[1].key`` from ``("jobs", 1, "key")``; a union's member tags are left out."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _FIELD.match(part):
            out += f".{part}" if out else part
    return out


def _model_at(model: type[Input], loc: tuple[Any, ...]) -> type[Input]:
    """The (nested) model that holds the field at ``loc``."""
    current: type[Input] = model
    for part in loc:
        if isinstance(part, int) or part not in current.model_fields:
            continue
        nested = _nested_model(current.model_fields[part].annotation)
        if nested is None:
            break
        current = nested
    return current


def _nested_model(annotation: Any) -> type[Input] | None:
    if isinstance(annotation, type) and issubclass(annotation, Input):
        return annotation
    for arg in get_args(annotation):
        found = _nested_model(arg)
        if found is not None:
            return found
    return None


__all__ = ["InputT", "refusal", "validated"]
