"""WAL safety, the pure parts: when a slot is warned about or failed, what the status,
the metrics and the local PostgreSQL's command line say."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from cdc.capture.slot import slot_health
from cdc.check.status import PipelineStatus
from cdc.cli.metrics import families
from cdc.cli.render import pipeline_table
from cdc.core.settings import Settings
from cdc.stack.components.postgres import Postgres

GiB = 1 << 30
ADVICE = "fix the connector, or `cdc drop` an abandoned pipeline"
RESNAPSHOT = (
    "run `cdc resync` (a new slot, and only the gap mended in every store from the source), "
    "or take a new snapshot: `cdc drop`, then `cdc snapshot`"
)


def slot(**row: Any) -> dict[str, Any]:
    return {
        "name": "cdc_cdc",
        "active": False,
        "wal_retained_bytes": 1024,
        "confirmed_flush_lsn": "0/16B3748",
        "wal_status": "reserved",
        "safe_wal_size": 3 * GiB,
        "max_slot_wal_keep_size": "4GB",
        **row,
    }


def test_a_slot_under_the_threshold_is_ok() -> None:
    assert slot_health(slot(wal_retained_bytes=GiB), GiB) == ("ok", None)


def test_retained_wal_past_the_threshold_warns_and_says_what_to_do() -> None:
    health, problem = slot_health(slot(wal_retained_bytes=GiB + 1, safe_wal_size=GiB), GiB)
    assert health == "warning"
    assert problem is not None and "\n" not in problem
    assert problem.startswith("slot cdc_cdc retains 1.0 GiB of WAL, more than ")
    assert "pipeline.wal_retained_warn_bytes (1.0 GiB)" in problem
    assert "PostgreSQL invalidates the slot after 1.0 GiB more" in problem
    assert problem.endswith(ADVICE)


def test_an_unlimited_server_says_the_disk_can_fill() -> None:
    row = slot(wal_retained_bytes=2 * GiB, safe_wal_size=None, max_slot_wal_keep_size="-1")
    health, problem = slot_health(row, GiB)
    assert health == "warning" and problem is not None
    assert "nothing limits it (max_slot_wal_keep_size -1)" in problem


def test_a_zero_threshold_never_warns() -> None:
    assert slot_health(slot(wal_retained_bytes=100 * GiB), 0) == ("ok", None)


def test_wal_no_longer_reserved_warns_even_under_the_threshold() -> None:
    health, problem = slot_health(slot(wal_status="unreserved", safe_wal_size=-5), GiB)
    assert health == "warning" and problem is not None
    assert "invalidates it at the next checkpoint" in problem and problem.endswith(ADVICE)


@pytest.mark.parametrize(
    ("row", "why"),
    [
        # PostgreSQL 13-16: wal_status only
        (
            {"wal_status": "lost", "wal_retained_bytes": None},
            "more WAL than max_slot_wal_keep_size (4GB)",
        ),
        # PostgreSQL 17+: invalidation_reason
        (
            {"wal_status": "lost", "invalidation_reason": "wal_removed"},
            "more WAL than max_slot_wal_keep_size (4GB)",
        ),
        ({"conflicting": True, "wal_status": "reserved"}, "rows it needed were removed"),
        ({"invalidation_reason": "wal_level_insufficient"}, "wal_level is no longer logical"),
        ({"invalidation_reason": "something_new"}, "invalidation reason something_new"),
    ],
)
def test_an_invalidated_slot_has_failed_and_names_the_re_snapshot(
    row: dict[str, Any], why: str
) -> None:
    health, problem = slot_health(slot(**row), GiB)
    assert health == "failed"
    assert problem is not None and "\n" not in problem
    assert problem.startswith("slot cdc_cdc is lost: PostgreSQL invalidated it (")
    assert why in problem
    assert "the changes after 0/16B3748 are gone" in problem
    assert problem.endswith(RESNAPSHOT)


def test_a_lost_slot_wins_over_the_threshold() -> None:
    health, _ = slot_health(slot(wal_status="lost", wal_retained_bytes=10 * GiB), GiB)
    assert health == "failed"


def status_with(row: dict[str, Any]) -> PipelineStatus:
    health, problem = slot_health(row, GiB)
    return PipelineStatus(
        "cdc", "done", "0/1", {**row, "warn_bytes": GiB, "health": health, "problem": problem}, None
    )


def rendered(status: PipelineStatus) -> str:
    out = Console(file=io.StringIO(), width=400)
    out.print(pipeline_table(status))
    return " ".join(out.file.getvalue().split())  # type: ignore[attr-defined]


def test_the_status_table_shows_the_problem() -> None:
    warned = rendered(status_with(slot(wal_retained_bytes=2 * GiB)))
    assert "warning" in warned and ADVICE in warned
    lost = rendered(status_with(slot(wal_status="lost", wal_retained_bytes=None)))
    assert "lost;" in lost and RESNAPSHOT in lost
    assert "warning" not in rendered(status_with(slot()))


def metric_lines(status: PipelineStatus) -> set[str]:
    """The exposition's lines, each sample as `name{labels} value` with the value a float."""
    from prometheus_client import generate_latest
    from prometheus_client.core import CollectorRegistry

    class Fixed:
        def collect(self) -> Any:
            return families([], status)

    registry = CollectorRegistry()
    registry.register(Fixed())
    lines = set()
    for line in generate_latest(registry).decode().splitlines():
        if not line.startswith("#"):
            sample, value = line.rsplit(" ", 1)
            line = f"{sample} {float(value)}"
        lines.add(line)
    return lines


def test_the_metrics_carry_the_threshold_the_warning_and_the_loss() -> None:
    lines = metric_lines(status_with(slot(wal_retained_bytes=2 * GiB, safe_wal_size=GiB)))
    assert f'cdc_slot_wal_retained_warn_bytes{{pipeline="cdc"}} {float(GiB)}' in lines
    assert f'cdc_slot_safe_wal_size_bytes{{pipeline="cdc"}} {float(GiB)}' in lines
    assert 'cdc_slot_wal_warning{pipeline="cdc"} 1.0' in lines
    assert 'cdc_slot_lost{pipeline="cdc"} 0.0' in lines
    help_line = next(line for line in lines if line.startswith("# HELP cdc_slot_wal_warning"))
    assert ADVICE in help_line
    problem = next(line for line in lines if line.startswith("cdc_slot_problem{"))
    assert 'health="warning"' in problem and ADVICE in problem

    lost = metric_lines(status_with(slot(wal_status="lost", safe_wal_size=None)))
    assert 'cdc_slot_lost{pipeline="cdc"} 1.0' in lost
    assert 'cdc_slot_wal_warning{pipeline="cdc"} 0.0' in lost
    assert not any(line.startswith("cdc_slot_safe_wal_size_bytes{") for line in lost)
    help_line = next(line for line in lost if line.startswith("# HELP cdc_slot_lost"))
    assert RESNAPSHOT in help_line

    ok = metric_lines(status_with(slot()))
    assert not any(line.startswith("cdc_slot_problem{") for line in ok)


def test_the_local_postgres_bounds_the_wal_a_slot_keeps(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    assert settings.postgres.max_slot_wal_keep_size == "4GB"
    Postgres(settings).data_path.mkdir(parents=True)  # command() writes pg_hba.conf there
    argv, _ = Postgres(settings).command()
    assert "max_slot_wal_keep_size=4GB" in argv
    small = Settings(data_dir=tmp_path, postgres={"max_slot_wal_keep_size": "512MB"})
    assert "max_slot_wal_keep_size=512MB" in Postgres(small).command()[0]


def test_the_settings_refuse_a_size_postgresql_would_not_take(tmp_path: Path) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        Settings(data_dir=tmp_path, postgres={"max_slot_wal_keep_size": "4 gigs"})
    assert Settings(data_dir=tmp_path).pipeline.wal_retained_warn_bytes == GiB


def test_a_lost_slot_or_a_failed_connector_or_task_is_broken_a_warning_is_not() -> None:
    def status(health: str = "ok", state: str = "RUNNING", tasks: tuple[str, ...] = ()) -> Any:
        found = PipelineStatus("p", "done", None, {"health": health}, None)
        found.connector = {"state": state, "tasks": list(tasks)}
        return found

    assert not status().broken
    assert not status(health="warning", tasks=("RUNNING",)).broken
    assert not PipelineStatus("p", "none", None, None, None).broken  # no slot, no connector
    assert status(health="failed").broken
    assert status(state="FAILED").broken
    assert status(tasks=("RUNNING", "FAILED")).broken


def test_an_idle_slot_nearing_postgresql_18s_idle_timeout_is_a_warning() -> None:
    # idle_replication_slot_timeout (PostgreSQL 18) invalidates a slot idle that long
    near = slot(idle_s=2 * 3600.0, idle_replication_slot_timeout_s=3 * 3600)
    health, problem = slot_health(near, GiB)
    assert health == "warning"
    assert problem is not None and "idle for 2.0h" in problem
    assert "idle_replication_slot_timeout (3.0h)" in problem
    assert slot_health(slot(idle_s=600.0, idle_replication_slot_timeout_s=3 * 3600), GiB)[0] == "ok"
    # no timeout set (0, or a server before 18): idle is fine
    assert slot_health(slot(idle_s=9e6, idle_replication_slot_timeout_s=None), GiB)[0] == "ok"


def test_a_slot_postgresql_invalidated_for_idling_says_so() -> None:
    health, problem = slot_health(slot(invalidation_reason="idle_timeout"), GiB)
    assert health == "failed"
    assert problem is not None and "idle longer than idle_replication_slot_timeout" in problem


def test_a_standbys_slot_synchronized_standby_slots_leaves_out_is_a_failover_risk() -> None:
    """PostgreSQL 17+: without synchronized_standby_slots naming a standby's physical slot,
    the connector can get changes that standby lacks, lost on promoting it."""
    row = slot(failover=True, physical_slots=["standby1"], synchronized_standby_slots="")
    health, problem = slot_health(row, GiB)
    assert health == "warning" and problem is not None and "\n" not in problem
    assert "does not name the physical slot(s) standby1" in problem
    named = slot(failover=True, physical_slots=["standby1"], synchronized_standby_slots="standby1")
    assert slot_health(named, GiB) == ("ok", None)
    # before 17 (no such setting, no failover slots) and with no standby: nothing to say
    old = slot(failover=None, physical_slots=["standby1"], synchronized_standby_slots=None)
    assert slot_health(old, GiB) == ("ok", None)
    alone = slot(failover=True, physical_slots=[], synchronized_standby_slots="")
    assert slot_health(alone, GiB) == ("ok", None)
    plain = slot(failover=False, physical_slots=["standby1"], synchronized_standby_slots="")
    assert "is not a failover slot" in (slot_health(plain, GiB)[1] or "")


def test_a_configured_standby_without_the_slot_synchronized_is_a_failover_risk() -> None:
    def on(**standby: Any) -> Any:
        entry = {"address": "10.0.0.2:5432", "error": None, "in_recovery": True, **standby}
        return slot(
            failover=True,
            physical_slots=["standby1"],
            synchronized_standby_slots="standby1",
            standbys=[entry],
        )

    assert slot_health(on(has_slot=True, synced=True), GiB) == ("ok", None)
    health, problem = slot_health(on(has_slot=False, synced=None), GiB)
    assert health == "warning" and problem is not None
    assert "standby 10.0.0.2:5432 does not hold slot cdc_cdc synchronized" in problem
    assert "sync_replication_slots = on" in problem
    down = slot_health(on(error="connection refused"), GiB)[1] or ""
    assert "does not answer (connection refused)" in down
    promoted = slot_health(on(in_recovery=False, has_slot=True, synced=True), GiB)[1] or ""
    assert "is not in recovery" in promoted
    table = pipeline_table(PipelineStatus("p", "done", None, on(has_slot=True, synced=True), None))
    out = io.StringIO()
    Console(file=out, width=300).print(table)
    assert "failover slot; synced on standby 10.0.0.2:5432" in out.getvalue()


def test_standbys_are_host_and_port(tmp_path: Path) -> None:
    from pydantic import ValidationError

    settings = Settings(data_dir=tmp_path, postgres={"standbys": ["db2.internal:5433"]})
    there = settings.postgres.at("db2.internal:5433")
    assert (there.host, there.port, there.user) == ("db2.internal", 5433, settings.postgres.user)
    assert settings.postgres.at("[::1]:5432").host == "::1"
    with pytest.raises(ValidationError, match="is not host:port"):
        Settings(data_dir=tmp_path, postgres={"standbys": ["db2.internal"]})
