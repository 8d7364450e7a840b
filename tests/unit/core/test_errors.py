"""Every error the project raises on purpose lives in cdc/core/errors.py under one root, with
an exit code of its own that the README lists."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

from cdc.core import errors
from cdc.core.errors import CdcError

ROOT = Path(__file__).resolve().parents[3]


def _subclasses(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


def _import_everything() -> None:
    for package in ("cdc",):
        for module in pkgutil.walk_packages([str(ROOT / package)], prefix=f"{package}."):
            if not module.name.endswith("__main__"):
                importlib.import_module(module.name)


def test_every_error_class_lives_in_errors_py() -> None:
    _import_everything()
    outside = [c.__qualname__ for c in _subclasses(CdcError) if c.__module__ != errors.__name__]
    assert not outside


def test_exit_codes_are_one_per_kind_and_in_the_readme() -> None:
    classes = [CdcError, *_subclasses(CdcError)]
    for a in classes:
        for b in classes:
            if a is not b and a.exit_code == b.exit_code:
                # only a refinement of another kind shares its code (not of the root's
                # 1, which means drift)
                assert CdcError not in (a, b) and (issubclass(a, b) or issubclass(b, a)), (a, b)
    readme = (ROOT / "README.md").read_text()
    listed = re.search(r"exit code \((.*?)\)\.", readme, re.S)
    assert listed is not None
    codes = {int(n) for n in re.findall(r"(?:^|, )(\d+) ", listed.group(1).replace("\n", " "))}
    assert {c.exit_code for c in classes} == codes


def test_a_carried_error_is_read_from_the_last_line_naming_its_kind_or_a_subclass() -> None:
    from cdc.core.errors import (
        StoreBusyError,
        StoreUnavailableError,
        carried_message,
    )

    assert carried_message(StoreBusyError("busy"), StoreUnavailableError) == "busy"
    text = (
        "Traceback...\ncdc.core.errors.StoreUnavailableError: Redis at a does not answer\n"
        "During handling...\ncdc.core.errors.StoreBusyError: OpenSearch at b is busy  \nmore"
    )
    # the last one raised; a subclass's name tells its kind too
    assert carried_message(RuntimeError(text), StoreUnavailableError) == "OpenSearch at b is busy"
    assert carried_message(RuntimeError(text), StoreBusyError) == "OpenSearch at b is busy"
    assert carried_message(RuntimeError("ValueError: bad"), StoreUnavailableError) is None


def test_a_component_that_cannot_be_reached_is_one_line_naming_it() -> None:
    import kafka.errors
    import opensearchpy
    import psycopg
    import redis

    cases = [
        (kafka.errors.KafkaTimeoutError("Unable to bootstrap from 127.0.0.1:1"), "Kafka"),
        (redis.ConnectionError("Error 111 connecting to 127.0.0.1:1.\nmore"), "Redis"),
        (opensearchpy.ConnectionTimeout("TIMEOUT", "read timed out", None), "OpenSearch"),
        (psycopg.errors.AdminShutdown("terminating connection"), "PostgreSQL"),
    ]
    for exc, component in cases:
        down = errors.unanswered(exc)
        assert isinstance(down, errors.ComponentError), exc
        said = str(down)
        assert said.startswith(f"{component} could not be reached ({type(exc).__name__}: "), said
        assert "\n" not in said and "`cdc up`" in said, said
    # the client's own first line once, not its class name twice
    kafka_said = str(errors.unanswered(cases[0][0]))
    assert kafka_said.count("KafkaTimeoutError") == 1, kafka_said


def test_any_other_error_keeps_its_traceback() -> None:
    import psycopg

    for exc in (ValueError("a bug"), KeyError("x"), psycopg.errors.UndefinedTable("no t")):
        assert errors.unanswered(exc) is None
