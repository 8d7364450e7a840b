"""The one place a view's kind is looked at: its settings' class selects its view class.
`VIEWS` is the warehouse's views door (its declaration's `views`): how the apply job and
the checks reach the views (cdc/stores/base.py DerivedViews)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from cdc.core.catalog import Table
from cdc.core.errors import ConfigError
from cdc.core.settings import Settings
from cdc.core.settings.views import (
    HoppingWindow,
    SessionWindow,
    SlidingWindow,
    StreamStreamJoin,
    StreamTableJoin,
    TableJoin,
    TumblingWindow,
    ViewSettings,
)
from cdc.stores.base import DerivedView, DerivedViews
from cdc.stores.warehouse.views.base import StreamingView, View
from cdc.stores.warehouse.views.enrichment import EnrichmentView
from cdc.stores.warehouse.views.queries import ViewQuery, view_queries
from cdc.stores.warehouse.views.stream_join import StreamJoinView
from cdc.stores.warehouse.views.table_join import TableJoinView
from cdc.stores.warehouse.views.windows import FillingWindowView, SessionView, SlidingView

__all__ = [
    "VIEWS",
    "VIEW_CLASSES",
    "check_views",
    "queries_of",
    "streaming",
    "view_of",
    "views_of",
]

VIEW_CLASSES: dict[type[ViewSettings], type[View]] = {
    TableJoin: TableJoinView,
    StreamTableJoin: EnrichmentView,
    StreamStreamJoin: StreamJoinView,
    TumblingWindow: FillingWindowView,
    HoppingWindow: FillingWindowView,
    SlidingWindow: SlidingView,
    SessionWindow: SessionView,
}


def view_of(settings: ViewSettings) -> View:
    """The view its settings describe."""
    return VIEW_CLASSES[type(settings)](settings)


def views_of(settings: Settings) -> list[View]:
    """Every view of the pipeline (`apply.joins`, then `apply.windows`), each streaming
    view knowing the query it shares (queries.view_queries)."""
    views = [view_of(v) for v in (*settings.apply.joins, *settings.apply.windows)]
    view_queries(streaming(views), share=settings.apply.views_share_queries)
    return views


def streaming(views: Iterable[object]) -> list[StreamingView]:
    """The views kept by a streaming query of their own."""
    return [v for v in views if isinstance(v, StreamingView)]


def queries_of(views: Sequence[DerivedView]) -> list[ViewQuery]:
    """The streaming queries that keep the streaming views among `views` (as views_of
    placed them: by their checkpoint)."""
    queries: dict[str, list[StreamingView]] = {}
    for view in streaming(views):
        queries.setdefault(view.checkpoint_label, []).append(view)
    return [ViewQuery(members) for members in queries.values()]


def check_views(settings: Settings, tables: dict[str, Table]) -> list[View]:
    """The views, once each names captured tables and existing columns (ConfigError, in
    one line, else); their names are unique."""
    views = views_of(settings)
    names = [v.name for v in views]
    if len(set(names)) != len(names):
        raise ConfigError(f"view names must be unique: {', '.join(sorted(names))}")
    for view in views:
        view.check_settings(tables, settings.pipeline.name)
    return views


VIEWS = DerivedViews(of=views_of, checked=check_views, queries=queries_of)
