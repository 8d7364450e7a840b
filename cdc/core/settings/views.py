"""The derived views' settings (`[[apply.joins]]`, `[[apply.windows]]`): one class per
kind, selected by its `kind`; their behaviour is cdc/stores/warehouse/views/."""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    model_validator,
)

ViewName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,62}$")]
QualifiedTable = Annotated[str, Field(pattern=r"^[^.\s]+\.[^.\s]+$")]


_DURATION = r"^[0-9]{1,9} (second|minute|hour|day)s?$"
_UNIT_MS = {"second": 1000, "minute": 60_000, "hour": 3_600_000, "day": 86_400_000}


def duration_ms(text: str) -> int:
    """'10 minutes' -> 600000 (the settings' window and watermark form)."""
    count, unit = text.split()
    return int(count) * _UNIT_MS[unit.rstrip("s")]


# the settings that belong to one kind of view only, and that kind (the first named when
# several have it): a view of another kind naming one is told where it belongs
_KIND_OF_FIELD = {
    "when": "stream_stream",
    "within": "stream_stream",
    "slide": "hopping",
    "gap": "session",
    "group_by": "session",
    "watermark": "stream_stream",
}


class _ViewSettings(BaseModel):
    """What every derived view has: a name, the table it reads, its kind."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: ViewName
    table: QualifiedTable
    kind: str

    @property
    def sides(self) -> tuple[str, ...]:
        """The captured tables it reads."""
        return (self.table,)

    @model_validator(mode="before")
    @classmethod
    def _fields_of_other_kinds(cls, data: Any) -> Any:
        """A setting of another kind of view is refused with the kind it is for."""
        if not isinstance(data, dict):
            return data
        what = "join" if issubclass(cls, JoinSettings) else "window"
        (kind,) = get_args(cls.model_fields["kind"].annotation)
        kept = {}
        for name, value in data.items():
            if name in cls.model_fields:
                kept[name] = value
            elif name == "window" and kind == "session":
                raise ValueError(
                    f"window {data.get('name')} is a session window: it has a gap, not a window"
                )
            elif name in _KIND_OF_FIELD and value not in (None, {}, []):
                raise ValueError(
                    f"{what} {data.get('name')} is {kind}: {name} is for "
                    f'kind = "{_KIND_OF_FIELD[name]}"'
                )
            elif name not in _KIND_OF_FIELD:
                kept[name] = value  # refused as unknown
        return kept


class JoinSettings(_ViewSettings):
    """A table joined with the table one of its columns references, kept in the warehouse."""

    references: QualifiedTable
    on: str = Field(description="the column of `table` holding the referenced primary key")
    columns: list[str] = Field(
        default_factory=list, description="the referenced table's columns to carry"
    )
    prefix: str | None = Field(None, description="default: `on` without _id, then _")

    @property
    def sides(self) -> tuple[str, ...]:
        return (self.table, self.references)

    @property
    def carried(self) -> list[str]:
        """The view's names of the referenced columns it carries."""
        return [self.column_prefix + c for c in self.columns]

    @property
    def column_prefix(self) -> str:
        if self.prefix is not None:
            return self.prefix
        return self.on.removesuffix("_id") + "_"

    @model_validator(mode="after")
    def _carries_a_column(self) -> JoinSettings:
        if not self.columns:
            raise ValueError(f"join {self.name}: name at least one column to carry")
        return self


class TableJoin(JoinSettings):
    """kind `table` (a table-table join): each row of `table` with `columns` of the
    `references` row whose primary key equals its `on` column (NULLs when there is
    none), named `<prefix><column>`. A change on either side updates the joined rows."""

    kind: Literal["table"] = "table"


class StreamTableJoin(JoinSettings):
    """kind `stream_table` (an enrichment): each row ever inserted into `table` (an
    event: it stays when the row is later changed or deleted) with `columns` of the
    `references` row as it was when the insert committed, at the insert's position in
    the source: a later change of the referenced row never rewrites it."""

    kind: Literal["stream_table"]


class StreamStreamJoin(JoinSettings):
    """kind `stream_stream` (two streams within a window): each row inserted into
    `table` (the start) with the first later change of a `references` row whose `on`
    column holds the start's key and whose values match `when` (the end), committed at
    most `within` after the start; a start with no end within is kept as such once the
    watermark has passed its window. `references` may be `table` itself (on = its key)."""

    kind: Literal["stream_stream"]
    on: str = Field(description="the column of `references` holding `table`'s key")
    prefix: str | None = Field(None, description="default: end_")
    when: dict[str, list[str]] = Field(
        default_factory=dict,
        description="the end's columns and the values (as text) one of which each must "
        'hold, e.g. {status = ["shipped", "cancelled"]}',
    )
    within: str = Field(pattern=_DURATION, description="the longest start-to-end time")
    watermark: str = Field(
        "10 minutes",
        pattern=_DURATION,
        description="how late an event may come (older ones are counted, not joined)",
    )

    @property
    def column_prefix(self) -> str:
        return "end_" if self.prefix is None else self.prefix

    @model_validator(mode="before")
    @classmethod
    def _within_given(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("within") is None:
            raise ValueError(
                f'join {data.get("name")} is stream_stream: set within (e.g. "30 minutes")'
            )
        return data

    @model_validator(mode="after")
    def _carries_a_column(self) -> StreamStreamJoin:  # an end may carry nothing
        for column, values in self.when.items():
            if not values:
                raise ValueError(f"join {self.name}: when.{column} names no value")
        return self


class WindowSettings(_ViewSettings):
    """Rows created in `table` per window of commit time, and the sum of a column: a
    Structured Streaming aggregation with a watermark. An event whose commit time is
    older than the newest commit time seen minus `watermark` is too late and not
    counted (`cdc status` shows how many were)."""

    sum: str | None = Field(None, description="a numeric column to add up")
    watermark: str = Field("10 minutes", pattern=_DURATION)

    @property
    def key(self) -> list[str]:
        """The columns that name one window in its table."""
        return ["window_start"]


class _Sized(WindowSettings):
    window: str = Field("1 minute", pattern=_DURATION, description="its length")

    @property
    def step(self) -> str:
        """How often a window starts."""
        return self.window

    @model_validator(mode="after")
    def _longer_than_zero(self) -> _Sized:
        if duration_ms(self.window) == 0:
            raise ValueError(f"window {self.name}: its window must be longer than 0")
        return self


class TumblingWindow(_Sized):
    """kind `tumbling`: windows of `window` one after the other, kept as they fill."""

    kind: Literal["tumbling"] = "tumbling"


class HoppingWindow(_Sized):
    """kind `hopping`: windows of `window` starting every `slide` (an event is in each
    window that holds its time), kept as they fill."""

    kind: Literal["hopping"]
    slide: str = Field(pattern=_DURATION, description="how often a window starts")

    @model_validator(mode="before")
    @classmethod
    def _slide_given(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("slide") is None:
            raise ValueError(f"window {data.get('name')} is hopping: set its slide")
        return data

    @property
    def step(self) -> str:
        return self.slide

    @model_validator(mode="after")
    def _shorter_slide(self) -> HoppingWindow:
        if not 0 < duration_ms(self.slide) < duration_ms(self.window):
            raise ValueError(
                f"window {self.name}: slide {self.slide} must be shorter than its "
                f"window {self.window} (and not 0)"
            )
        return self


class SlidingWindow(_Sized):
    """kind `sliding`: one window ending at each creation's commit time, holding the
    creations of the `window` up to it (both ends included), kept once the watermark
    has passed its end."""

    kind: Literal["sliding"]

    @property
    def key(self) -> list[str]:
        return ["window_end"]


class SessionWindow(WindowSettings):
    """kind `session`: per value of `group_by`, creations less than `gap` apart (a
    session ends `gap` after its last creation), kept once the watermark has passed its
    end."""

    kind: Literal["session"]
    gap: str = Field(pattern=_DURATION, description="the quiet time that ends a session")
    group_by: str | None = Field(
        None, description="the column whose values have sessions of their own"
    )

    @model_validator(mode="before")
    @classmethod
    def _gap_given(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("gap") is None:
            raise ValueError(
                f'window {data.get("name")} is a session window: set its gap (e.g. "10 minutes")'
            )
        return data

    @model_validator(mode="after")
    def _gap_longer_than_zero(self) -> SessionWindow:
        if duration_ms(self.gap) == 0:
            raise ValueError(
                f'window {self.name} is a session window: set its gap (e.g. "10 minutes")'
            )
        return self

    @property
    def key(self) -> list[str]:
        return [*([self.group_by] if self.group_by else []), "window_start"]


def _kind(default: str, *others: str) -> Any:
    """The tag of a view's settings: its kind, `default` when it names none."""

    def tag(value: Any) -> str | None:
        if isinstance(value, dict):
            return str(value.get("kind", default))
        return getattr(value, "kind", None)  # None: not a view's settings (refused)

    kinds = ", ".join(f'"{k}"' for k in (default, *others))
    return Discriminator(
        tag,
        custom_error_type="view_kind",
        custom_error_message=f"a view is a table of settings whose kind is one of {kinds}",
    )


# a view's settings, of the class its kind selects (`[[apply.joins]]`, `[[apply.windows]]`)
JoinView = Annotated[
    Annotated[TableJoin, Tag("table")]
    | Annotated[StreamTableJoin, Tag("stream_table")]
    | Annotated[StreamStreamJoin, Tag("stream_stream")],
    _kind("table", "stream_table", "stream_stream"),
]
WindowAggregate = Annotated[
    Annotated[TumblingWindow, Tag("tumbling")]
    | Annotated[HoppingWindow, Tag("hopping")]
    | Annotated[SlidingWindow, Tag("sliding")]
    | Annotated[SessionWindow, Tag("session")],
    _kind("tumbling", "hopping", "sliding", "session"),
]
ViewSettings = JoinSettings | WindowSettings
