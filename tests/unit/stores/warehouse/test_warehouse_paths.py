"""Each pipeline's warehouse tables are its own, as its cache keys and indexes are: a
pipeline started over a warehouse another one wrote does not find that one's rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc.core.catalog import reserved_problem
from cdc.core.settings import Settings
from cdc.core.settings.pipeline import PipelineSettings
from cdc.stores.warehouse.settings import with_warehouse
from cdc.stores.warehouse.tables import current_path, view_path, warehouse_root


def settings_for(prefix: str, warehouse_path: str | None = None) -> Settings:
    settings = Settings(data_dir=Path("/srv/cdc"))  # type: ignore[call-arg]
    pipe = PipelineSettings(name=prefix, topic_prefix=prefix, tables=["public.orders"])
    return with_warehouse(settings.model_copy(update={"pipeline": pipe}), path=warehouse_path)


def test_two_pipelines_never_share_a_delta_table() -> None:
    one, two = (warehouse_root(settings_for(p)) for p in ("shop", "shop2"))
    assert current_path(one, "public.orders") == "/srv/cdc/warehouse/shop/public/orders/current"
    assert current_path(two, "public.orders") == "/srv/cdc/warehouse/shop2/public/orders/current"
    assert view_path(one, "per_minute") != view_path(two, "per_minute")


def test_a_configured_root_holds_the_pipelines_folder() -> None:
    root = warehouse_root(settings_for("shop", "s3a://lake/cdc/"))
    assert current_path(root, "sales.orders") == "s3a://lake/cdc/shop/sales/orders/current"


@pytest.mark.parametrize(
    ("columns", "stores", "said"),
    [
        (["id", "_cdc_lsn"], (), "its column _cdc_lsn starts with _cdc_"),
        (["id", "valid_to"], ("warehouse",), "its column valid_to is one the warehouse history"),
        (["id", "valid_to"], ("cache", "search"), None),
        (["id", "_id"], ("search",), "its column _id is one of OpenSearch's metadata fields"),
        (["id", "_id"], ("cache", "warehouse"), None),
        (["key", "op", "offset", "lsn", "_cdc", "cdc_x", "k_key", "_idx"], ("warehouse",), None),
    ],
)
def test_only_the_stores_own_column_names_are_refused(
    columns: list[str], stores: tuple[str, ...], said: str | None
) -> None:
    problem = reserved_problem(columns, stores)
    assert (problem is None) if said is None else (problem or "").startswith(said), problem


def test_the_pipelines_state_folders_are_their_owners_alone(tmp_path: Path) -> None:
    """Checkpoints, Spark's scratch and a warehouse under data_dir hold captured rows:
    they were 0755, so any local user read the parquet files."""
    from cdc.core.state_folders import make_state_dir, prepare_job_state

    settings = Settings(data_dir=tmp_path)
    make_state_dir(settings, tmp_path / "spark", 0o755)  # as an older cdc made it
    prepare_job_state(settings)
    for name in ("spark", "checkpoints", "warehouse"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o700, name
