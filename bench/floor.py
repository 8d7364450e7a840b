"""The engine's floor: the simplest streaming query this machine runs, to set the apply
job's figures against (issue 17).

    .venv/bin/python bench/floor.py [--rate 200] [--seconds 60] [--triggers "0 seconds,1 second"]

Needs the local stack (`cdc up`): its Kafka and Redis. A producer writes RATE small keyed
JSON records per second to a topic of the benchmark's own; one Spark query (the project's
own session: local master, jars, settings) reads it with the Kafka source and, in
`foreachBatch`, collects each micro-batch to the driver and writes it to Redis in one
pipeline of HSETs. Nothing else: no catalog, no progress file, no parsing.

Latency of a record = the end of the Redis pipeline that wrote it minus the record's
Kafka timestamp (set by the producer when it sends it). CPU: the cores Spark's JVM, its
Python workers and this process (the driver's Python side) kept busy while measuring.
Each trigger is measured after a warm-up of 10 s. Appends the figures to
bench/results/floor.jsonl.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ResourceSampler, record
from bench.streaming import percentiles
from cdc.core.clients import kafka_admin, kafka_client_kwargs, redis_client
from cdc.core.settings import Settings, load_settings
from cdc.core.spark import kafka_options, spark_session

WARM_UP_S = 10.0


def produce(settings: Settings, topic: str, rate: int, stop: threading.Event) -> None:
    """RATE keyed records per second (1,000 keys), sent in ticks of 10 ms until stopped."""
    from kafka import KafkaProducer

    producer = KafkaProducer(**kafka_client_kwargs(settings.kafka), linger_ms=0, acks=1)
    sent, started = 0, time.monotonic()
    try:
        while not stop.is_set():
            due = int((time.monotonic() - started) * rate)
            for i in range(sent, due):
                key = str(i % 1000).encode()
                value = json.dumps({"id": i % 1000, "n": i}).encode()
                producer.send(topic, key=key, value=value)
            sent = max(sent, due)
            producer.flush()
            stop.wait(0.01)
    finally:
        producer.close()


def measure(settings: Settings, spark: Any, topic: str, trigger: str, seconds: int) -> dict:
    """One query at `trigger` for WARM_UP_S + `seconds`; the figures of the last `seconds`."""
    done: list[tuple[float, list[int]]] = []  # (finished at ms, Kafka timestamps)
    redis = redis_client(settings.redis)
    prefix = f"floor:{uuid.uuid4().hex[:6]}:"

    def write(batch: Any, batch_id: int) -> None:
        rows = batch.selectExpr(
            "CAST(key AS STRING) AS k", "CAST(value AS STRING) AS v", "timestamp"
        ).collect()
        if not rows:
            return
        pipe = redis.pipeline(transaction=False)
        for row in rows:
            pipe.hset(prefix + row["k"], mapping={"v": row["v"]})
        pipe.execute()
        stamps = [int(row["timestamp"].timestamp() * 1000) for row in rows]
        done.append((time.time() * 1000, stamps))

    source = (
        spark.readStream.format("kafka")
        .options(**kafka_options(settings))
        .option("subscribe", topic)
        .option("startingOffsets", "latest")
        .load()
    )
    checkpoint = settings.data_dir / "bench" / f"floor-{uuid.uuid4().hex[:6]}"
    query = (
        source.writeStream.option("checkpointLocation", str(checkpoint))
        .foreachBatch(write)
        .trigger(processingTime=trigger)
        .start()
    )
    try:
        with ResourceSampler() as resources:
            time.sleep(WARM_UP_S)
            measured_from = time.time() * 1000
            before = resources.cpu()
            time.sleep(seconds)
            cores = resources.cpu().cores_since(before)
    finally:
        query.stop()
        keys = list(redis.scan_iter(match=prefix + "*", count=1000))
        for i in range(0, len(keys), 1000):
            redis.delete(*keys[i : i + 1000])
        shutil.rmtree(checkpoint, ignore_errors=True)
    latencies = [end - stamp for end, stamps in done if end >= measured_from for stamp in stamps]
    batches = sum(1 for end, _ in done if end >= measured_from)
    return {
        "trigger": trigger,
        "events": len(latencies),
        "batches": batches,
        **percentiles([float(ms) for ms in latencies]),
        "cores": {
            k: v for k, v in cores.items() if k.startswith(("spark", "apply driver", "machine"))
        },
    }


def run_floor(settings: Settings, rate: int, seconds: int, triggers: list[str]) -> list[dict]:
    """The floor query at each trigger, fed at `rate` records/s; one result per trigger."""
    topic = f"floor-{uuid.uuid4().hex[:8]}"
    admin = kafka_admin(settings.kafka)
    from kafka.admin import NewTopic

    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    spark = spark_session(settings, "cdc-bench-floor")
    stop = threading.Event()
    producer = threading.Thread(target=produce, args=(settings, topic, rate, stop), daemon=True)
    producer.start()
    try:
        results = []
        for trigger in triggers:
            results.append(measure(settings, spark, topic, trigger, seconds))
            print(f"floor, trigger {trigger!r}: {results[-1]}", flush=True)
        return results
    finally:
        stop.set()
        producer.join(timeout=10)
        admin.delete_topics([topic])
        admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=200, help="records per second")
    parser.add_argument("--seconds", type=int, default=60, help="measured, per trigger")
    parser.add_argument("--triggers", default="0 seconds,1 second")
    args = parser.parse_args()
    settings = load_settings()
    triggers = [t.strip() for t in args.triggers.split(",") if t.strip()]
    runs = run_floor(settings, args.rate, args.seconds, triggers)
    record(
        {"benchmark": "floor", "rate": args.rate, "seconds": args.seconds, "runs": runs},
        "floor",
        settings,
    )


if __name__ == "__main__":
    main()
