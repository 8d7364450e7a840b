"""Freshness is a product figure: under a steady load, `cdc status` shows the cache's
commit-to-visible p50 and p99 and its SLO met (exit 0); Redis frozen, the SLO is
reported breached (exit 1, the lag named); Redis back, the cache catches up and, once
the window has passed the catch-up, the SLO is met again."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import pytest

from tests.conftest import Capture
from tests.helpers import apply_process, run_cdc, steady_updates
from tests.logcheck import poll

# about three minutes of load: in `make test-long`, not in CI's run
pytestmark = [pytest.mark.integration, pytest.mark.long]

WINDOW_S = 15
SLO_S = 4


def redis_pid(data_dir: Path) -> int:
    return int((data_dir / "run" / "redis.pid").read_text().split()[0])


def test_a_frozen_cache_breaches_its_slo_then_recovers(captured: Capture) -> None:
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, n int NOT NULL)",
        "INSERT INTO {name} SELECT g, 0 FROM generate_series(1, 100) g",
        prefix="slo",
    )
    name, settings, dsn = t.name, t.settings, t.dsn
    env = {
        **t.env,
        "CDC_APPLY__FRESHNESS_SLO_S": json.dumps({"cache": SLO_S}),
        "CDC_APPLY__FRESHNESS_WINDOW_S": str(WINDOW_S),
    }

    def cache() -> tuple[int, dict]:  # type: ignore[type-arg]
        shown = run_cdc("status", "-o", "json", env=env)
        stores = json.loads(shown.stdout)["pipeline"]["stores"]
        return shown.returncode, stores.get("cache", {}).get("freshness") or {}

    def met() -> bool:
        code, fresh = cache()
        return code == 0 and fresh.get("p99_s") is not None and fresh["breached"] is False

    stop = threading.Event()
    writer = threading.Thread(target=steady_updates, args=(dsn, name, 100, stop), daemon=True)
    frozen = None
    with apply_process(env, ["cache"]) as apply:
        try:
            writer.start()
            poll(met, 240, "the cache's freshness SLO to be met under the load")
            _, fresh = cache()
            assert fresh["slo_s"] == SLO_S and fresh["events"] > 0
            assert 0 < fresh["p50_s"] <= fresh["p99_s"] <= SLO_S
            assert fresh["histogram"]["count"] >= fresh["events"]

            frozen = redis_pid(settings.data_dir)
            os.kill(frozen, signal.SIGSTOP)

            def breached() -> bool:
                code, fresh = cache()
                return code == 1 and fresh.get("breached") is True

            poll(breached, 120, "the cache's SLO to be reported breached")
            _, fresh = cache()
            assert "lag" in fresh["why"] and f"SLO of {SLO_S}s" in fresh["why"]
            shown = run_cdc("status", env=env)
            assert shown.returncode == 1
            assert "breached" in " ".join(shown.stdout.split())

            os.kill(frozen, signal.SIGCONT)
            frozen = None
            poll(met, 240, "the cache's SLO to be met again once Redis answers")
            assert apply.poll() is None
        finally:
            stop.set()
            writer.join(timeout=30)
            if frozen is not None:
                os.kill(frozen, signal.SIGCONT)
