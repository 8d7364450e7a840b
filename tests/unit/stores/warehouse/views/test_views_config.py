"""Join views and window aggregates: their settings and the checks before the apply job starts."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from cdc.core.catalog import Column, Table
from cdc.core.errors import ConfigError
from cdc.core.settings import Settings
from cdc.core.settings.apply import ApplySettings
from cdc.core.settings.views import (
    HoppingWindow,
    JoinSettings,
    JoinView,
    SessionWindow,
    StreamStreamJoin,
    StreamTableJoin,
    TableJoin,
    TumblingWindow,
    WindowAggregate,
    WindowSettings,
)
from cdc.stores.warehouse.views.registry import check_views, view_of
from cdc.stores.warehouse.views.windows import FillingWindowView

# a view's settings as a settings file gives them: its kind selects the class
JOIN: TypeAdapter[JoinSettings] = TypeAdapter(JoinView)
WINDOW: TypeAdapter[WindowSettings] = TypeAdapter(WindowAggregate)


def table(name: str, *columns: str, key: tuple[str, ...] = ("id",)) -> Table:
    cols = tuple(Column(c, "int8", "int8", "N", False, None, False) for c in ("id", *columns))
    return Table("public", name, cols, key, "d", 0, 0)


TABLES = {
    "public.orders": table("orders", "customer_id", "total"),
    "public.customers": table("customers", "name"),
}


def settings_with(**apply: object) -> Settings:
    return Settings().model_copy(update={"apply": ApplySettings(**apply)})


def join(**changes: object) -> JoinSettings:
    fields = {
        "name": "enriched",
        "table": "public.orders",
        "references": "public.customers",
        "on": "customer_id",
        "columns": ["name"],
    } | changes
    return JOIN.validate_python(fields)


def test_the_joined_columns_are_named_after_the_referencing_column() -> None:
    assert join().column_prefix == "customer_"
    assert join(prefix="c_").column_prefix == "c_"
    assert join(on="buyer").column_prefix == "buyer_"


def test_valid_views_pass_the_check() -> None:
    window = TumblingWindow(name="per_minute", table="public.orders", sum="total")
    check_views(settings_with(joins=[join()], windows=[window]), TABLES)


@pytest.mark.parametrize(
    ("view", "message"),
    [
        (join(table="public.nope"), "reads public.nope, which pipeline cdc does not capture"),
        (join(on="buyer_id"), "public.orders has no column buyer_id"),
        (join(columns=["name", "age"]), "public.customers has no column age"),
    ],
)
def test_a_join_on_what_is_not_there_is_refused_in_one_line(view: JoinView, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        check_views(settings_with(joins=[view]), TABLES)
    assert "\n" not in str(caught.value)


def test_a_join_needs_a_single_column_key_on_the_referenced_side() -> None:
    tables = TABLES | {"public.customers": table("customers", "name", key=("id", "name"))}
    with pytest.raises(ConfigError, match="composite key"):
        check_views(settings_with(joins=[join()]), tables)


def test_window_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="no column revenue"):
        check_views(
            settings_with(windows=[TumblingWindow(name="w", table="public.orders", sum="revenue")]),
            TABLES,
        )
    with pytest.raises(ValidationError):
        TumblingWindow(name="w", table="public.orders", window="one minute")
    with pytest.raises(ConfigError, match="unique"):
        check_views(
            settings_with(
                joins=[join(name="same")],
                windows=[TumblingWindow(name="same", table="public.orders")],
            ),
            TABLES,
        )


def test_window_durations_in_milliseconds() -> None:
    from cdc.core.settings.views import duration_ms

    assert duration_ms("1 minute") == 60_000
    assert duration_ms("10 minutes") == 600_000
    assert duration_ms("30 seconds") == 30_000
    assert duration_ms("2 hours") == 7_200_000
    assert duration_ms("1 day") == 86_400_000


def test_a_stream_table_join_is_declared_beside_the_others() -> None:
    enrichment = join(name="priced", kind="stream_table")
    check_views(settings_with(joins=[join(), enrichment]), TABLES)
    with pytest.raises(ValidationError, match="kind"):
        join(kind="stream_stream")


def test_a_joined_column_named_as_one_the_view_has_is_refused() -> None:
    view = join(columns=["id"], prefix="")  # the referenced id over the table's own
    with pytest.raises(ConfigError, match="id is already a column of the view"):
        check_views(settings_with(joins=[view]), TABLES)


def test_an_enrichment_column_named_as_the_event_s_is_refused() -> None:
    tables = TABLES | {"public.customers": table("customers", "ts")}
    view = join(kind="stream_table", columns=["ts"], prefix="event_")
    with pytest.raises(ConfigError, match="event_ts is already a column of the view"):
        check_views(settings_with(joins=[view]), tables)
    check_views(settings_with(joins=[join(columns=["ts"], prefix="event_")]), tables)


def test_a_stream_tables_column_named_as_the_event_s_is_refused() -> None:
    """A stream table's own column `event_ts` would be written over by the event's time."""
    tables = TABLES | {"public.orders": table("orders", "customer_id", "event_ts")}
    view = join(kind="stream_table")
    with pytest.raises(ConfigError, match="column event_ts is named like one the view adds"):
        check_views(settings_with(joins=[view]), tables)
    check_views(settings_with(joins=[join()]), tables)  # a table join adds no such column


def test_a_hopping_window_needs_a_slide_shorter_than_itself() -> None:
    hopping = HoppingWindow(
        name="w", table="public.orders", kind="hopping", window="5 minutes", slide="1 minute"
    )
    assert hopping.slide == "1 minute"
    for wrong, message in [
        ({"kind": "hopping"}, "is hopping: set its slide"),
        ({"kind": "hopping", "slide": "5 minutes"}, "must be shorter than its window"),
        ({"kind": "hopping", "slide": "0 seconds"}, "must be shorter than its window"),
        ({"slide": "1 minute"}, 'is tumbling: slide is for kind = "hopping"'),
        ({"kind": "rolling"}, "kind"),
        ({"kind": "session", "gap": "1 minute"}, "has a gap, not a window"),
        ({"kind": "tumbling", "window": "0 minutes"}, "must be longer than 0"),
    ]:
        fields = {"name": "w", "table": "public.orders", "window": "5 minutes"} | wrong
        with pytest.raises(ValidationError, match=message):
            WINDOW.validate_python(fields)


def test_a_session_window_needs_a_gap_and_no_window() -> None:
    session = SessionWindow(
        name="w", table="public.orders", kind="session", gap="10 minutes", group_by="customer_id"
    )
    assert session.key == ["customer_id", "window_start"]
    # as `cdc` hands them on in the environment (CDC_APPLY__WINDOWS: a JSON dump)
    assert WINDOW.validate_python(session.model_dump()) == session
    assert TumblingWindow(name="w", table="public.orders").key == ["window_start"]
    for wrong, message in [
        ({"kind": "session"}, "is a session window: set its gap"),
        ({"kind": "session", "gap": "0 minutes"}, "is a session window: set its gap"),
        ({"kind": "session", "gap": "1 minute", "window": "5 minutes"}, "has a gap, not a"),
        ({"gap": "1 minute"}, 'is tumbling: gap is for kind = "session"'),
        ({"kind": "hopping", "slide": "1 minute", "group_by": "id"}, "is hopping: group_by is"),
    ]:
        fields = {"name": "w", "table": "public.orders"} | wrong
        with pytest.raises(ValidationError, match=message):
            WINDOW.validate_python(fields)


def test_a_stream_stream_join_needs_its_window() -> None:
    fields: dict[str, object] = {
        "name": "j",
        "table": "public.orders",
        "references": "public.orders",
        "on": "id",
    }
    shipped = StreamStreamJoin(
        **fields, kind="stream_stream", within="30 minutes", when={"status": ["shipped"]}
    )
    assert shipped.column_prefix == "end_"
    enrichment = StreamTableJoin(**fields, kind="stream_table", columns=["total"])
    for view in (shipped, enrichment):
        assert JOIN.validate_python(view.model_dump()) == view
    wrongs: list[tuple[dict[str, object], str]] = [
        ({"kind": "stream_stream"}, "is stream_stream: set within"),
        ({"kind": "stream_stream", "within": "1 hour", "when": {"status": []}}, "names no value"),
        ({"within": "1 hour", "columns": ["x"]}, "is table: within is for kind"),
        ({"kind": "stream_table", "when": {"a": ["b"]}}, "is stream_table: when is for kind"),
        ({}, "name at least one column"),
    ]
    for wrong, message in wrongs:
        with pytest.raises(ValidationError, match=message):
            JOIN.validate_python({**fields, **wrong})


def test_an_event_is_in_each_hopping_window_that_holds_its_time() -> None:
    minute = 60_000
    tumbling = TumblingWindow(name="t", table="public.orders", window="5 minutes")
    hopping = HoppingWindow(
        name="h", table="public.orders", kind="hopping", window="5 minutes", slide="2 minutes"
    )
    at = 12 * minute + 30_000  # 00:12:30
    assert FillingWindowView(tumbling).starts(at) == [10 * minute]
    # windows [8, 13), [10, 15), [12, 17) hold it; [6, 11) has ended, [14, 19) not begun
    assert FillingWindowView(hopping).starts(at) == [8 * minute, 10 * minute, 12 * minute]
    # at a window's very start it is in that one, and no more in the one ending then
    assert FillingWindowView(hopping).starts(13 * minute) == [10 * minute, 12 * minute]


def shipped(**changes: object) -> JoinSettings:
    # each customer created, ended by the first order naming it
    fields = {
        "name": "first_order",
        "kind": "stream_stream",
        "table": "public.customers",
        "references": "public.orders",
        "on": "customer_id",
        "within": "1 hour",
        "columns": ["total"],
    } | changes
    return JOIN.validate_python(fields)


def test_a_stream_stream_join_links_the_end_s_column_to_the_start_s_key() -> None:
    check_views(settings_with(joins=[shipped(when={"total": ["1"]})]), TABLES)
    for view, message in [
        (shipped(on="buyer_id"), "public.orders has no column buyer_id"),
        (shipped(when={"state": ["x"]}), "public.orders has no column state"),
        (shipped(prefix="", columns=["id"]), "id is already a column of the view"),
    ]:
        with pytest.raises(ConfigError, match=message):
            check_views(settings_with(joins=[view]), TABLES)
    pair = TABLES | {"public.customers": table("customers", "name", key=("id", "name"))}
    with pytest.raises(ConfigError, match="needs a single-column key"):
        check_views(settings_with(joins=[shipped()]), pair)


def test_a_session_is_grouped_by_a_column_of_its_table() -> None:
    session = SessionWindow(
        name="s", table="public.orders", kind="session", gap="1 minute", group_by="customer_id"
    )
    check_views(settings_with(windows=[session]), TABLES)
    wrong = session.model_copy(update={"group_by": "buyer_id"})
    with pytest.raises(ConfigError, match=r"public\.orders has no column buyer_id"):
        check_views(settings_with(windows=[wrong]), TABLES)


def test_a_session_grouped_by_a_column_named_like_sparks_own_is_refused() -> None:
    """Spark names a session's window `session_window`, beside the group_by column."""
    tables = TABLES | {"public.orders": table("orders", "session_window")}
    session = SessionWindow(
        name="s", table="public.orders", kind="session", gap="1 minute", group_by="session_window"
    )
    with pytest.raises(ConfigError, match="group_by session_window is a column the window has"):
        check_views(settings_with(windows=[session]), tables)


@pytest.mark.parametrize("kind", ["table", "stream_table", "stream_stream"])
def test_a_carried_column_named_like_the_pipelines_own_is_refused(kind: str) -> None:
    """A join's helper columns are named `_cdc_*` (`_cdc_ref`, `_cdc_rank`...): no column
    it carries may be named so, whatever the table's columns are named."""
    view = shipped(prefix="_cdc_") if kind == "stream_stream" else join(kind=kind, prefix="_cdc_")
    with pytest.raises(ConfigError, match=r"column _cdc_\w+ starts with _cdc_, .*another prefix"):
        check_views(settings_with(joins=[view]), TABLES)


def test_only_the_joins_a_batch_refreshes_keep_its_frames() -> None:
    from cdc.stores.warehouse.steps import frames_to_keep, steps_of

    joins = [
        TableJoin(name="a", table="public.o", references="public.c", on="c_id", columns=["n"]),
        StreamTableJoin(
            name="b",
            kind="stream_table",
            table="public.i",
            references="public.p",
            on="p_id",
            columns=["n"],
        ),
        # a query of its own: no frame of the batch is kept for it (a Spark job each)
        StreamStreamJoin(
            name="c",
            kind="stream_stream",
            within="30 minutes",
            table="public.s",
            references="public.t",
            on="t_id",
            columns=["n"],
        ),
    ]
    assert frames_to_keep(steps_of([view_of(j) for j in joins])) == {
        "public.o": {"keys"},
        "public.c": {"keys"},
        "public.i": {"created"},
        "public.p": {"versions"},
    }


def test_a_streaming_views_definition_is_its_settings_and_its_plan() -> None:
    """Another setting is another definition (its checkpoint starts afresh); a default
    given or left out is one definition."""
    from cdc.stores.warehouse.views.streams import PLAN

    session = SessionWindow(name="w", table="public.a", kind="session", gap="5 minutes")
    defined = view_of(session).definition()  # type: ignore[attr-defined]
    assert defined.endswith(f" plan {PLAN}") and '"gap":"5 minutes"' in defined
    wider = session.model_copy(update={"gap": "6 minutes"})
    assert view_of(wider).definition() != defined  # type: ignore[attr-defined]
    given = SessionWindow(
        name="w", table="public.a", kind="session", gap="5 minutes", watermark="10 minutes"
    )
    assert view_of(given).definition() == defined  # type: ignore[attr-defined]


def test_a_stream_table_join_of_a_table_with_itself_keeps_both_frames() -> None:
    from cdc.stores.warehouse.steps import frames_to_keep, steps_of

    itself = StreamTableJoin(
        name="e",
        kind="stream_table",
        table="public.o",
        references="public.o",
        on="id",
        columns=["n"],
    )
    assert frames_to_keep(steps_of([view_of(itself)])) == {"public.o": {"created", "versions"}}
