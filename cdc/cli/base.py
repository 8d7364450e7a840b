"""What every command of `cdc` shares: the Typer app the commands register on
(cli/commands/), the output options, the settings and the line for people."""

from __future__ import annotations

import logging
from typing import Annotated

import typer
from rich.text import Text

from cdc.cli.output import OutputForm, RowsForm, console
from cdc.core.errors import ConfigError
from cdc.core.settings import Settings, load_settings

__all__ = [
    "OutputOption",
    "RowsOutputOption",
    "app",
    "check_stores",
    "console_say",
    "err",
    "settings",
]


app = typer.Typer(
    name="cdc",
    help="Keep derived stores in sync with PostgreSQL: Debezium into Kafka, applied by Spark.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = console(stderr=True)
OutputOption = Annotated[
    OutputForm, typer.Option("--output", "-o", help="text for people, json for scripts")
]
RowsOutputOption = Annotated[
    RowsForm, typer.Option("--output", "-o", help="text for people, json or csv for scripts")
]


@app.callback()
def _root(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="log what happens")] = False,
) -> None:
    # the terminal gets warnings and errors (everything with --verbose); a Spark job's
    # Python log (ours, Great Expectations') also goes to its file (cdc/core/spark.py)
    terminal = logging.StreamHandler()
    terminal.setLevel(logging.DEBUG if verbose else logging.WARNING)
    terminal.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[terminal])
    if not verbose:
        logging.getLogger("kafka").setLevel(logging.CRITICAL)
        # a store that does not answer is told in one line by `cdc apply`, not per request
        logging.getLogger("opensearch").setLevel(logging.CRITICAL)


def settings() -> Settings:
    return load_settings()


def console_say(message: str) -> None:
    """The CLI's Say: a line on standard error, dim-dotted, as text (no markup)."""
    err.print(Text.assemble(("·", "dim"), " ", message), highlight=False)  # text, no markup


def check_stores(stores: list[str]) -> None:
    """A store name that is not one: refused before anything runs."""
    from cdc.stores.registry import check_store_names

    try:
        check_store_names(stores)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None
