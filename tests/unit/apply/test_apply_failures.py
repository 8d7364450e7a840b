"""What `cdc apply` says and does about a failed batch: a store or PostgreSQL that does
not answer is waited for; any other failure is told in one line."""

from __future__ import annotations

import pytest

from cdc.apply.batch import unavailable_reason
from cdc.apply.guards import backlog, check_source_lineage, check_source_not_rewound
from cdc.apply.job import failure_line
from cdc.core.errors import SourceRewoundError, SourceUnavailableError, StoreUnavailableError
from cdc.log.progress import Progress

# what Spark's query.exception() carried back when PostgreSQL restarted under a batch
PROXY_FAILURE = """[FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided \
function in foreach batch sink. Reason: An exception was raised by the Python Proxy. Return \
Message: Traceback (most recent call last):
  File "/x/pyspark/sql/utils.py", line 163, in call
    self.func(DataFrame(jdf, wrapped_session_jdf), batch_id)
  File "/x/cdc/apply/job.py", line 171, in write
    write_once(batch, batch_id)
psycopg.OperationalError: connection failed: Connection refused

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/x/cdc/apply/job.py", line 189, in write_once
    tables = captured_tables(settings)
cdc.core.errors.SourceUnavailableError: PostgreSQL at 127.0.0.1:5432 does not answer

\tat py4j.Protocol.getReturnValue(Protocol.java:476)
Caused by: org.apache.spark.SparkException: Job aborted
"""


def test_a_failure_carried_back_by_spark_is_told_by_its_python_exception() -> None:
    assert failure_line(RuntimeError(PROXY_FAILURE)) == (
        "SourceUnavailableError: PostgreSQL at 127.0.0.1:5432 does not answer"
    )


def test_a_failure_without_a_traceback_is_its_first_line() -> None:
    assert failure_line(RuntimeError("Kafka went away\nmore")) == "Kafka went away"
    assert failure_line(RuntimeError("")) == "RuntimeError"


def test_a_store_that_does_not_answer_is_recognised_also_as_text() -> None:
    assert unavailable_reason(StoreUnavailableError("Redis down")) == "Redis down"
    worker = (
        "Traceback...\ncdc.core.errors.StoreUnavailableError: OpenSearch at x does not answer\n"
    )
    assert unavailable_reason(RuntimeError(worker)) == "OpenSearch at x does not answer"
    assert unavailable_reason(RuntimeError("ValueError: bad")) is None


def test_postgres_gone_in_a_python_worker_is_recognised_as_text() -> None:
    """Generated columns are computed in Spark's Python workers: PostgreSQL going away
    there reaches the driver as text, and the apply job waits for it."""
    worker = "Traceback...\ncdc.core.errors.SourceUnavailableError: PostgreSQL does not answer\n"
    assert unavailable_reason(RuntimeError(worker), SourceUnavailableError) == (
        "PostgreSQL does not answer"
    )
    assert unavailable_reason(RuntimeError(worker)) is None  # not a store
    assert unavailable_reason(SourceUnavailableError("down"), SourceUnavailableError) == "down"


def test_a_source_behind_what_a_store_applied_stops_it() -> None:
    # as the progress file holds it (JSON)
    record = {"commit_lsn": 0x2_0000_0000, "truncated": {"public.t": [0x1_0000_0000, 5]}}
    applied = Progress.from_json(record)
    check_source_not_rewound("cache", 0x2_0000_0000, applied)  # caught up: fine
    check_source_not_rewound("cache", 0x1_0000_0000, Progress())  # nothing applied yet
    with pytest.raises(SourceRewoundError, match=r"WAL is at 1/FF.*up to 2/0.*cdc rebuild"):
        check_source_not_rewound("cache", 0x1_0000_00FF, applied)
    # a TRUNCATE's position counts as applied too
    with pytest.raises(SourceRewoundError, match=r"up to 1/0"):
        check_source_not_rewound("cache", 0xFFFF, Progress(truncated={"public.t": (1 << 32, 5)}))


def test_the_backlog_counts_the_log_after_what_a_store_applied() -> None:
    ends = {("t", 0): 100, ("t", 1): 50, ("u", 0): 7}
    # partition 0 applied through offset 89; partition 1 through its end; u not at all
    assert backlog(ends, {("t", 0): 89, ("t", 1): 49}) == 10 + 0 + 7
    # a partition applied further than the log ends (never counted negative)
    assert backlog({("t", 0): 10}, {("t", 0): 20}) == 0
    assert backlog({}, {("t", 0): 20}) == 0


def test_a_source_on_a_timeline_that_left_before_what_a_store_applied_stops_it() -> None:
    from cdc.capture.timeline import parse_timeline_history

    # timeline 3 left 2 at 0/5000000, which had left 1 at 0/3000000
    history = "1\t0/3000000\tno recovery target specified\n\n2\t0/5000000\tbefore 2026-11-26\n"
    forks = parse_timeline_history(history)
    assert forks == {1: 0x3000000, 2: 0x5000000}
    applied = Progress(commit_lsn=0x4FFFFFF, source=["42", 2])
    check_source_lineage("cache", ("42", 2), lambda _: forks, applied)  # the same timeline
    check_source_lineage("cache", ("42", 3), lambda _: forks, applied)  # left after it
    check_source_lineage("cache", ("42", None), lambda _: forks, applied)  # a standby
    check_source_lineage("cache", ("42", 3), lambda _: forks, Progress())  # none recorded
    ahead = Progress(commit_lsn=0x5000000, source=["42", 2])
    with pytest.raises(SourceRewoundError, match="timeline 3, which left it at 0/5000000"):
        check_source_lineage("cache", ("42", 3), lambda _: forks, ahead)
    with pytest.raises(SourceRewoundError, match="does not descend from it"):
        check_source_lineage("cache", ("42", 3), lambda _: {}, applied)
    with pytest.raises(SourceRewoundError, match="another database cluster"):
        check_source_lineage("cache", ("43", 2), lambda _: forks, applied)


def test_a_log_past_where_a_promoted_server_left_the_old_timeline_is_found() -> None:
    """Review F7: before the connector streams from a promoted standby, the position it
    already delivered is compared with where the standby's timeline left its parent."""
    from cdc.capture.connector_config import log_past_fork

    forks = {1: 0x3000000, 2: 0x5000000}  # timeline 3 left 2 at 0/5000000
    assert log_past_fork(forks, 0x5000010) == (2, 0x5000010)
    assert log_past_fork(forks, 0x5000000) is None  # a commit ending at the fork
    assert log_past_fork(forks, 0x4000000) is None  # the standby had all of it
    assert log_past_fork(forks, None) is None  # Connect holds no offset
    assert log_past_fork({}, 0x5000010) is None  # timeline 1: never promoted


def test_a_subclass_of_unavailable_carried_back_as_text_is_waited_for_as_in_process() -> None:
    """A StoreBusyError is a StoreUnavailableError: carried back by Spark as text, it is
    waited for as it is when raised in the driver (isinstance)."""
    worker = "Traceback...\ncdc.core.errors.StoreBusyError: another writer holds x\n"
    assert unavailable_reason(RuntimeError(worker)) == "another writer holds x"


def test_a_rewound_source_stops_the_job_raised_here_or_carried_as_text() -> None:
    from cdc.apply.job import _fatal
    from cdc.core.errors import LogRewoundError

    here = SourceRewoundError("source behind")
    assert _fatal(here) is here
    carried = _fatal(RuntimeError("x\ncdc.core.errors.LogRewoundError: topic made again\n"))
    assert type(carried) is LogRewoundError and str(carried) == "topic made again"
    carried = _fatal(RuntimeError("x\ncdc.core.errors.SourceRewoundError: behind\n"))
    assert type(carried) is SourceRewoundError and str(carried) == "behind"
    assert _fatal(RuntimeError("ValueError: no")) is None
