"""The warehouse on object storage (issue 68 item 3; docs/operations.md, "The warehouse on
object storage"): a local S3-compatible server (S3Proxy, tests/s3_server.py) holds the
Delta tables. The initial snapshot and the changes streamed after it reach them through
`cdc apply` (Spark's S3A and Delta's S3 log store), its streaming query checkpointed
in the bucket too (`[apply] checkpoints`); delta-rs, given only the storage
options a user would give it, reads every row as PostgreSQL holds it; `cdc verify` and
`cdc query` read them too; a bucket that is not there and refused credentials are each
one line, without the secret."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdc.core.errors import StoreBusyError
from cdc.core.one_writer import one_writer
from tests.conftest import Capture, settings_for
from tests.helpers import apply_process, run_cdc
from tests.s3_server import s3_server

pytestmark = pytest.mark.integration

COLUMNS = "id int PRIMARY KEY, note text, n bigint, flag boolean"


def _source(dsn: str, table: str) -> dict[int, tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f"SELECT id, note, n, flag FROM {table}").fetchall()
    return {r[0]: tuple(r) for r in rows}


def _delta_rs(path: str, options: dict[str, str]) -> dict[int, tuple[Any, ...]] | None:
    """The table as delta-rs reads it from the bucket (None while it is not there)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(path, storage_options=options)
    except TableNotFoundError:
        return None
    rows = table.to_pyarrow_table(columns=["id", "note", "n", "flag"]).to_pylist()
    return {r["id"]: (r["id"], r["note"], r["n"], r["flag"]) for r in rows}


def _one_line_error(result: Any, secret: str) -> str:
    out = result.stdout + result.stderr
    assert result.returncode != 0, out[-2000:]
    assert "Traceback" not in out, out[-4000:]
    assert secret not in out
    said = [line for line in result.stderr.splitlines() if line.strip()]
    return said[-1] if said else ""


# 6 to 7 minutes on two cores, and Spark's S3 connector (`make install-s3`): in test-long
@pytest.mark.long
def test_snapshot_and_changes_reach_a_warehouse_on_s3_and_delta_rs_reads_them(
    captured: Capture, tmp_path: Path
) -> None:
    with s3_server() as s3:
        s3.make_bucket("lake")
        t = captured(
            f"CREATE TABLE {{name}} ({COLUMNS})",
            "INSERT INTO {name} SELECT g, 'row ' || g, g * 10, g % 2 = 0 "
            "FROM generate_series(1, 300) g",
            prefix="s3",
        )
        prefix = t.settings.pipeline.topic_prefix
        schema, name = t.table.split(".", 1)
        current = f"s3://lake/cdc/{prefix}/{schema}/{name}/current"
        history = f"s3://lake/cdc/{prefix}/{schema}/{name}/history"
        # the streaming query's checkpoint in the bucket too ([apply] checkpoints)
        env = {
            **t.env,
            **s3.warehouse_env("lake"),
            "CDC_APPLY__CHECKPOINTS": "s3a://lake/checkpoints",
        }
        options = s3.delta_rs_options()

        def reached(expected: dict[int, tuple[Any, ...]], apply: Any) -> Any:
            """delta-rs's read of the bucket once it equals `expected` (or the last one)."""
            deadline = time.monotonic() + 300
            held = None
            while time.monotonic() < deadline and apply.poll() is None:
                held = _delta_rs(current, options)
                if held == expected:
                    break
                time.sleep(2)
            said = log.read_text()[-3000:] if log.exists() else ""
            assert apply.poll() is None, f"cdc apply exited {apply.returncode}: {said}"
            return held

        log = tmp_path / "apply.log"
        with apply_process(env, ["warehouse"], log=log) as apply:
            # the snapshot's rows first
            held = reached(_source(t.dsn, t.table), apply)
            assert held == _source(t.dsn, t.table), "the snapshot did not reach the bucket"
            # then changes streamed while the apply job runs: inserts, updates, deletes,
            # each in transactions of their own, over a few of its micro-batches
            with psycopg.connect(t.dsn, autocommit=True) as conn:
                for step in range(5):
                    conn.execute(
                        f"INSERT INTO {t.table} SELECT g, 'new ' || g, g, true "
                        f"FROM generate_series({1000 + step * 20}, {1019 + step * 20}) g"
                    )
                    conn.execute(
                        f"UPDATE {t.table} SET n = n + 1, note = 'changed' WHERE id % 7 = {step}"
                    )
                    low = step * 10 + 1
                    conn.execute(f"DELETE FROM {t.table} WHERE id BETWEEN {low} AND {low + 2}")
                    conn.execute(f"UPDATE {t.table} SET flag = NULL WHERE id = {200 + step}")
                    time.sleep(1.5)
            expected = _source(t.dsn, t.table)
            held = reached(expected, apply)
        assert held is not None, "no Delta table in the bucket"
        missing = sorted(set(expected) - set(held))[:5]
        extra = sorted(set(held) - set(expected))[:5]
        different = [k for k in expected if k in held and held[k] != expected[k]][:5]
        assert held == expected, f"missing {missing}, extra {extra}, different {different}"

        # the history holds every version: the snapshot's rows and each change since
        from deltalake import DeltaTable

        versions = DeltaTable(history, storage_options=options).to_pyarrow_table().num_rows
        assert versions >= 300 + 5 * 20, versions
        # the snapshot's commit, then the changes' own
        assert DeltaTable(current, storage_options=options).version() >= 2
        # the Delta tables are in the bucket, none in a local folder
        logs = list(s3.folder.glob(f"lake/cdc/{prefix}/{schema}/{name}/*/_delta_log"))
        assert len(logs) == 2, logs
        assert not (t.settings.data_dir / "warehouse" / prefix).exists()
        # Spark's checkpoint of the query is in the bucket; the driver's records stay local
        pipeline = t.settings.pipeline.name
        commits = s3.folder / "lake" / "checkpoints" / pipeline / "warehouse" / "commits"
        assert any(p.name.isdigit() for p in commits.iterdir()), list(commits.iterdir())
        records = t.settings.data_dir / "checkpoints" / pipeline
        assert (records / "warehouse.progress.json").exists()
        assert not (records / "warehouse").exists()

        # `cdc verify` and `cdc query` read the bucket through Spark
        verified = run_cdc("verify", "--store", "warehouse", "-o", "json", env=env)
        out = verified.stdout + verified.stderr
        assert verified.returncode == 0, out[-4000:]
        document = json.loads(verified.stdout)
        assert document["ok"], verified.stdout[-4000:]
        queried = run_cdc("query", f"SELECT count(*) AS n FROM {name}", "-o", "json", env=env)
        assert queried.returncode == 0, (queried.stdout + queried.stderr)[-4000:]
        assert json.loads(queried.stdout) == [{"n": len(expected)}]

        # a wrong secret and a bucket that is not there: one line each, no secret printed
        wrong = "wrong" + s3.secret_access_key[5:]
        refused = run_cdc("query", "SELECT 1", env={**env, "AWS_SECRET_ACCESS_KEY": wrong})
        line = _one_line_error(refused, wrong)
        assert "refused the credentials" in line and s3.access_key_id in line, line
        assert s3.secret_access_key not in refused.stdout + refused.stderr
        absent = run_cdc(
            "query", "SELECT 1", env={**env, "CDC_STORES__WAREHOUSE__PATH": "s3://nolake/cdc"}
        )
        line = _one_line_error(absent, s3.secret_access_key)
        assert "s3://nolake" in line and "does not exist" in line, line


def test_the_bucket_check_says_each_failure_in_one_line_without_the_secret() -> None:
    """check_bucket against the real server: a bucket there passes; one not there, a
    wrong secret, an unknown key and an endpoint nothing answers on are one line each."""
    from cdc.core.errors import ConfigError, StoreUnavailableError
    from cdc.core.object_store import ObjectStore, check_bucket
    from tests.helpers import free_ports

    with s3_server() as s3:
        s3.make_bucket("lake")

        def store(bucket: str, key: str, secret: str, endpoint: str = s3.endpoint) -> ObjectStore:
            return ObjectStore(bucket, "cdc", endpoint, "us-east-1", True, key, secret)

        check_bucket(store("lake", s3.access_key_id, s3.secret_access_key))
        wrong = "not-" + s3.secret_access_key
        (closed,) = free_ports(1)
        cases = [
            (
                store("nolake", s3.access_key_id, s3.secret_access_key),
                ConfigError,
                "does not exist",
            ),
            (store("lake", s3.access_key_id, wrong), ConfigError, "refused the credentials"),
            (store("lake", "nobody", wrong), ConfigError, "refused the credentials"),
            (
                store("lake", s3.access_key_id, wrong, f"http://127.0.0.1:{closed}"),
                StoreUnavailableError,
                "does not answer",
            ),
        ]
        for case, error, said in cases:
            with pytest.raises(error) as raised:
                check_bucket(case)
            line = str(raised.value)
            assert said in line and "\n" not in line, line
            assert wrong not in line and s3.secret_access_key not in line, line


def test_the_driver_reads_and_removes_a_query_checkpoint_in_a_bucket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`[apply] checkpoints = "s3a://…"`: what Spark writes there (a query's commits and
    metadata, in the layout Structured Streaming gives them) the driver reads with the
    warehouse's S3 settings: the newest committed batch, the query's id, an offsets file;
    a view query the views left is removed from the bucket, a store's kept; the
    pipeline's own records stay in data_dir."""
    from cdc.log.checkpoints import checkpoint, checkpoints_of_pipeline
    from cdc.log.progress import forget_other_view_queries, progress_file

    with s3_server() as s3:
        s3.make_bucket("lake")
        env = {
            **s3.warehouse_env("lake"),
            "CDC_DATA_DIR": str(tmp_path),
            "CDC_APPLY__CHECKPOINTS": "s3a://lake/checkpoints/",
        }
        settings = settings_for(env)
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):  # as the SDKs take them
            monkeypatch.setenv(key, env[key])
        name = settings.pipeline.name
        store = checkpoint(settings, "warehouse")
        assert str(store) == f"s3a://lake/checkpoints/{name}/warehouse"
        assert store.last_committed_batch() is None  # nothing there yet
        assert checkpoints_of_pipeline(settings) == []

        def put(key: str, text: bytes) -> None:
            # into the server's folder: it serves each file as an object
            placed = s3.folder / "lake" / "checkpoints" / name / key
            placed.parent.mkdir(parents=True, exist_ok=True)
            placed.write_bytes(text)

        for label, batches in (("warehouse", (0, 1, 12)), ("window-w", (0,))):
            for batch in batches:
                put(f"{label}/commits/{batch}", b'v1\n{"nextBatchWatermarkMs":0}')
                put(f"{label}/offsets/{batch}", b"v1\n{}\n{}")
            put(f"{label}/metadata", b'{"id":"4b0e"}')
        assert store.last_committed_batch() == 12
        assert store.query_id() == "4b0e"
        assert store.read("offsets/12").splitlines()[0] == "v1"
        labels = sorted(c.label for c in checkpoints_of_pipeline(settings))
        assert labels == ["warehouse", "window-w"]
        forget_other_view_queries(settings, set())
        assert [c.label for c in checkpoints_of_pipeline(settings)] == ["warehouse"]
        left = s3.folder / "lake" / "checkpoints" / name / "window-w"
        assert not [p for p in left.rglob("*") if p.is_file()]  # no object left
        assert progress_file(settings, "warehouse").is_relative_to(tmp_path)
        store.remove()
        assert store.last_committed_batch() is None and checkpoints_of_pipeline(settings) == []


def test_a_warehouse_on_s3_is_written_by_one_process_at_a_time(captured: Capture) -> None:
    """Delta on S3 commits safely from one Spark driver only: while one process holds the
    warehouse's writer lock (here the test, as an apply job would), a second `cdc apply`
    of it, and `cdc verify --repair`'s removal of keys only the warehouse has, are each
    refused in one line naming the holder, before Spark starts. The same pipeline on a
    local warehouse takes no lock."""
    t = captured("CREATE TABLE {name} (id int PRIMARY KEY)", prefix="one")
    env = {
        **t.env,
        "CDC_STORES__WAREHOUSE__PATH": "s3://lake/cdc",
        "CDC_STORES__WAREHOUSE__S3__ENDPOINT": "http://127.0.0.1:9",  # never reached
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "not-a-secret-of-anyone",
    }
    on_s3 = settings_for(env)
    with one_writer(on_s3, "warehouse", "the test's writer"):
        result = run_cdc("apply", "--once", "--store", "warehouse", env=env, timeout=300)
        line = _one_line_error(result, "not-a-secret-of-anyone")
        assert "being written by the test's writer (warehouse)" in line, line
        assert "one writer" in line, line
        with (
            pytest.raises(StoreBusyError, match="the test's writer"),
            one_writer(on_s3, "warehouse", "cdc verify --repair"),
        ):
            pass
    # released with its connection: the next writer takes it
    with one_writer(on_s3, "warehouse", "the next writer"):
        pass
    with (  # no lock on a local warehouse
        one_writer(t.settings, "warehouse", "a local warehouse's writer"),
        one_writer(t.settings, "warehouse", "another"),
    ):
        pass
