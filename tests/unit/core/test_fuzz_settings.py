"""Fuzz: the settings file. Any TOML text, any nested tables, and tables shaped like the
settings with values of any type, read through CDC_CONFIG by load_settings: a Settings,
or one ConfigError of one line that never holds the value of a password field."""

from __future__ import annotations

import contextlib
import io
import sys
import typing
from typing import Any
from unittest import mock

import pytest
import tomlkit
from hypothesis import example, given
from hypothesis import strategies as st
from pydantic import BaseModel, SecretStr

from cdc.core.errors import ConfigError
from cdc.core.settings import Settings, load_settings
from tests.unit.fuzzing import bounded, check_read, settings_file


def _models(annotation: Any) -> list[type[BaseModel]]:
    args = typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in args for m in _models(a)]


def _has_secret(annotation: Any) -> bool:
    return annotation is SecretStr or any(_has_secret(a) for a in typing.get_args(annotation))


def _fields(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """Every field of the settings, at its path, with its annotation (sections expanded)."""
    found: dict[tuple[str, ...], Any] = {}
    for name, info in model.model_fields.items():
        path = (*prefix, name)
        found[path] = info.annotation
        for sub in _models(info.annotation):
            if not prefix:  # sections only; the lists of joins and windows stay values
                found |= _fields(sub, path)
    return found


FIELDS = _fields(Settings)
SECRETS = sorted(path for path, annotation in FIELDS.items() if _has_secret(annotation))
LEAVES = sorted(
    path for path in FIELDS if not any(p[: len(path)] == path and p != path for p in FIELDS)
)

_scalar = (
    st.text(max_size=12)
    | st.integers(min_value=-(2**64), max_value=2**64)
    | st.floats()
    | st.booleans()
    | st.datetimes()
    | st.dates()
)
_value = st.recursive(
    _scalar,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
# a password no other drawn key or value can be (longer than any), with any characters
_password = st.text(max_size=20).map(lambda p: f"pw-{p}-0123456789")


def _nest(values: dict[tuple[str, ...], Any]) -> dict[str, Any]:
    document: dict[str, Any] = {}
    for path, value in values.items():
        node = document
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                break
            node = child
        else:
            node[path[-1]] = value
    return document


@st.composite
def settings_documents(draw: Any) -> tuple[str, list[str]]:
    """TOML shaped like the settings: some fields with values of any type (or a
    plausible one), unknown keys now and then, and every password field set to a
    secret; returns the text and the secrets."""
    chosen = draw(st.lists(st.sampled_from(LEAVES), max_size=6, unique=True))
    values: dict[tuple[str, ...], Any] = {path: draw(_value) for path in chosen}
    if draw(st.integers(0, 4)) == 0:
        section = draw(st.sampled_from([(), *{p[:1] for p in LEAVES if len(p) > 1}]))
        values[(*section, draw(st.text(min_size=1, max_size=8)))] = draw(_value)
    secrets = []
    for path in SECRETS:
        if draw(st.booleans()):
            secret = draw(_password)
            values[path] = secret
            secrets.append(secret)
    return tomlkit.dumps(_nest(values)), secrets


@bounded(200)
@given(st.text(max_size=200))
@example('[pipeline]\nname = "x"\n' + "a = " + "[" * 3000 + "]" * 3000).via("arrays nested deep")
@example('["a\\nb"]\nx = 1').via("a key holding a line break")
@example("x = 1\r\n\x00").via("a control character")
def test_any_text_is_settings_or_one_config_error(text: str) -> None:
    check_read(text)


@bounded(100)
@given(st.dictionaries(st.text(max_size=8), _value, max_size=5))
def test_any_nested_tables_are_settings_or_one_config_error(document: dict[str, Any]) -> None:
    check_read(tomlkit.dumps(document))


@bounded(150)
@given(settings_documents())
def test_settings_of_any_type_are_read_or_refused_without_the_passwords(
    case: tuple[str, list[str]],
) -> None:
    check_read(*case)


def test_every_password_field_is_fuzzed() -> None:
    assert {("postgres", "password"), ("pipeline", "replication_password")} <= set(SECRETS)


_unknown_key = st.text(min_size=1, max_size=12).filter(lambda k: k not in Settings.model_fields)


@bounded(30)
@given(_unknown_key)
@example("[/x]").via("a closing markup tag, which failed rich's print with a traceback")
@example("[bold]").via("an opening markup tag")
@example("a\nb").via("a line break")
@example("\\").via("a backslash, which rich's escape doubles at the end")
def test_cdc_says_a_settings_error_in_one_line_whatever_the_key(key: str) -> None:
    """What `cdc` prints for a settings file holding an unknown key: the ConfigError, as
    it is, on one line, and exit code 2."""
    from cdc.cli.app import main

    text = tomlkit.dumps({key: 1})
    with settings_file(text):
        try:
            load_settings()
        except ConfigError as exc:
            said = str(exc)
        stderr = io.StringIO()
        with (
            mock.patch.object(sys, "argv", ["cdc", "config"]),
            contextlib.redirect_stderr(stderr),
            pytest.raises(SystemExit) as exit,
        ):
            main()
    assert exit.value.code == 2
    assert stderr.getvalue() == f"error: {said}\n"
