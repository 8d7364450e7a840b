"""The Spark session every Spark job of the project runs in.

Jars come from the install step (.cache/jvm/spark/jars), never downloaded at
run time; jars that the pyspark wheel already ships are left out so that one
version of each library is on the classpath.
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import os
import re
import secrets
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from cdc.core.clients import kafka_jaas_config, kafka_java_config
from cdc.core.errors import INSTALL_HINT, ConfigError, NotInstalledError
from cdc.core.files import write_file
from cdc.core.object_store import check_bucket, s3a_jars, spark_s3_conf
from cdc.core.settings import Settings
from cdc.core.settings.connections import SECRET_KEY, SparkSettings
from cdc.core.state_folders import (
    checkpoint_store,
    local_warehouse,
    prepare_job_state,
    warehouse_store,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "ARCHIVE_OUT",
    "CHECKPOINT_FILE_MANAGER",
    "archive_path",
    "archive_stamp",
    "class_archive_options",
    "driver_address",
    "execution_profile",
    "jars_conf",
    "jdbc_ssl_options",
    "kafka_options",
    "spark_jars",
    "spark_master",
    "spark_session",
    "views_session",
]

_VERSIONED = re.compile(r"^(?P<name>.+?)-\d[\w.\-]*\.jar$")


def _artifact(jar: Path) -> str:
    match = _VERSIONED.match(jar.name)
    return match.group("name") if match else jar.stem


def kafka_options(settings: Settings, inline_ca: bool | None = None) -> dict[str, str]:
    """The options of every Spark Kafka source and sink of the project: the brokers and
    the security of `kafka` (protocol, SASL login, the CA as a PEM trust store), each
    prefixed `kafka.` as Spark hands them to its Kafka clients. The SASL login holds the
    password (Spark redacts it in plans and logs): never print these.

    The Kafka clients run on the executors. With `inline_ca` (by default when
    spark.master is not local: executors on other machines, without the CA file) the
    CA travels in the options as its PEM text instead of its path."""
    section = settings.kafka
    config = kafka_java_config(section, kafka_jaas_config(section))
    if inline_ca is None:
        inline_ca = not settings.spark.master.startswith("local")
    location = config.get("ssl.truststore.location")
    if inline_ca and location is not None:
        del config["ssl.truststore.location"]
        config["ssl.truststore.certificates"] = _pem(Path(location), "kafka.ca_file")
    return {
        "kafka.bootstrap.servers": section.bootstrap,
        **{f"kafka.{key}": value for key, value in config.items()},
    }


def jdbc_ssl_options(settings: Settings, inline_ca: bool | None = None) -> dict[str, str]:
    """The PostgreSQL JDBC driver's TLS options for Spark's reads, which run on the
    executors. With `inline_ca` (by default when spark.master is not local) the CA is
    given as its PEM text to the driver's SingleCertValidatingFactory, which trusts that
    one certificate, instead of a path the executors' machines do not have."""
    params = settings.postgres.jdbc_ssl_params()
    if inline_ca is None:
        inline_ca = not settings.spark.master.startswith("local")
    root = params.get("sslrootcert")
    if inline_ca and root is not None:
        pem = _pem(Path(root), "postgres.ca_file")
        if pem.count("-----BEGIN CERTIFICATE-----") != 1:
            raise ConfigError(
                f"postgres.ca_file {root} holds more than one certificate, and executors on "
                "other machines are given one (PgJDBC's SingleCertValidatingFactory): give "
                "the CA that signed the server's certificate alone"
            )
        del params["sslrootcert"]
        params["sslfactory"] = "org.postgresql.ssl.SingleCertValidatingFactory"
        params["sslfactoryarg"] = pem[pem.index("-----BEGIN CERTIFICATE-----") :].strip()
    return params


def _pem(path: Path, setting: str) -> str:
    """A CA file's text (PEM), or ConfigError in one line."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{setting} {path} cannot be read ({exc}): fix the path") from None
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise ConfigError(f"{setting} {path} holds no PEM certificate: give the CA as PEM")
    return text


def spark_jars(settings: Settings) -> list[Path]:
    """The project's jars for Spark, minus the libraries pyspark already has."""
    import pyspark

    jars_dir = settings.jvm_dir / "spark" / "jars"
    ours = sorted(jars_dir.glob("*.jar"))
    if not any(j.name.startswith("spark-sql-kafka") for j in ours):
        raise NotInstalledError(
            f"the Spark Kafka source is not installed (nothing in {jars_dir}): {INSTALL_HINT}"
        )
    shipped = {_artifact(j) for j in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return [j for j in ours if _artifact(j) not in shipped]


# Spark's log goes to <data_dir>/spark/spark.log (0600, rolled at 64 MB): only errors
# reach the terminal, where `cdc demo` draws its dashboard and `cdc apply` says what it does
_LOG4J2 = """\
rootLogger.level = {level}
rootLogger.appenderRef.file.ref = file
rootLogger.appenderRef.stderr.ref = console
rootLogger.appenderRef.stderr.level = error
appender.file.type = RollingFile
appender.file.name = file
appender.file.fileName = {log}
appender.file.filePattern = {log}.%i
appender.file.filePermissions = rw-------
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{yyyy-MM-dd HH:mm:ss}} %p %c{{1}}: %m%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 64MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 3
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{HH:mm:ss}} %p %c{{1}}: %m%n
logger.hadoop.name = org.apache.hadoop
logger.hadoop.level = error
logger.kafka.name = org.apache.kafka
logger.kafka.level = error
logger.sparkconf.name = org.apache.spark.SparkConf
logger.sparkconf.level = error
logger.localcheckpoint.name = org.apache.spark.rdd.MapPartitionsRDD
logger.localcheckpoint.level = error
# "Current batch is falling behind": `cdc status` and the dashboard show the lag
logger.trigger.name = org.apache.spark.sql.execution.streaming.runtime.ProcessingTimeExecutor
logger.trigger.level = error
"""


CHECKPOINT_FILE_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)


def _python_log(path: Path) -> None:
    """The job's Python log records of INFO and up also go to `path` (0600, rolled at
    64 MB), beside Spark's own log, once per process."""
    root = logging.getLogger()
    if any(getattr(h, "baseFilename", None) == str(path) for h in root.handlers):
        return
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
    handler = logging.handlers.RotatingFileHandler(path, maxBytes=64 << 20, backupCount=3)
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)


def spark_master(master: str, cores: int | None = None) -> str:
    """The master URL Spark is given: `local[*]` becomes twice the machine's cores in task
    slots. The stores' queries share the JVM, and a slot is held until its task ends: with
    one slot per core, a cache or search batch's tasks wait behind the warehouse's long
    MERGE tasks; with two, they start at once and the OS shares the cores
    (bench/results/streaming.jsonl). Any other URL is Spark's as given."""
    if master != "local[*]":
        return master
    return f"local[{2 * (cores or os.cpu_count() or 1)}]"


def snapshot_partitions(spark: SparkSettings) -> str:
    """The tasks Delta rebuilds a table's state from its log in, before each MERGE and
    after each commit it reads (by default 50, sized for logs of millions of files): on
    one machine one per core, which does it in half the time; on a cluster the session's
    shuffle partitions. Every task sends the driver its metrics, some 4 KB: 50 tasks
    per table and batch were most of what a batch's tasks sent the driver
    (docs/scaling.md). A user's spark.conf may set it."""
    if spark.master.startswith("local"):
        return str(max(os.cpu_count() or 1, 2))
    return str(spark.shuffle_partitions)


def execution_profile(settings: Settings) -> tuple[str, str]:
    """The apply job's profile (apply.profile), resolved, and why: `cluster` when asked,
    or (auto) when spark.master is not local or the warehouse is on a remote path."""
    chosen = settings.apply.profile
    if chosen != "auto":
        return chosen, f"apply.profile = {chosen}"
    if not settings.spark.master.startswith("local"):
        return "cluster", f"spark.master is {settings.spark.master}"
    if local_warehouse(settings) is None:
        return "cluster", "the warehouse is on a remote path"
    return "local", "spark.master is local and the warehouse on this machine"


def driver_address(master: str, conf: dict[str, str]) -> str | None:
    """The address the driver binds to and gives its executors (SPARK_LOCAL_IP): loopback
    for a local master, where nothing else need reach it; for a standalone master
    (`spark://host:port`), this machine's address on the route to the master, which its
    workers reach (Spark's own choice is the host name's address, or the first interface
    that is not loopback: on a machine with several networks, often not the cluster's);
    none otherwise, and none when `spark.driver.host` or `spark.driver.bindAddress` in
    spark.conf choose it."""
    if "spark.driver.bindAddress" in conf or "spark.driver.host" in conf:
        return None
    if master.startswith("local"):
        return "127.0.0.1"
    if not master.startswith("spark://"):
        return None  # YARN, Kubernetes: their own way of reaching the driver
    first = master.removeprefix("spark://").split(",")[0]  # the first of an HA list
    host, _, port = first.rpartition(":")
    return _route_source(host.strip("[]"), int(port) if port.isdigit() else 7077)


def _route_source(host: str, port: int) -> str | None:
    """This machine's address on its route to host:port (a UDP socket's connect sends
    nothing), or None when the host is not resolved or not routed."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.connect(address)
            return str(probe.getsockname()[0])
    except OSError:
        return None


def jars_conf(project: list[Path], conf: dict[str, str]) -> str:
    """`spark.jars`: the project's jars, then the user's own (spark.conf's `spark.jars`:
    an object store's connector, a JDBC driver), which add to them, never replace them."""
    own = [j.strip() for j in conf.get("spark.jars", "").split(",") if j.strip()]
    return ",".join([*(str(j) for j in project), *own])


def _with_secrets(builder: Any, settings: Settings, secret: dict[str, str]) -> SparkSession:
    """The session, its secret confs given through a properties file (0600, gone once
    the JVM has read it) rather than the `--conf` arguments PySpark puts on the Spark
    JVM's command line, which `ps` shows every local user."""
    if not secret:
        return builder.getOrCreate()  # type: ignore[no-any-return]
    path = settings.data_dir / "spark" / f".secrets-{os.getpid()}-{secrets.token_hex(4)}.conf"
    write_file(path, "".join(f"{k} {_escaped(v)}\n" for k, v in secret.items()))
    before = os.environ.get("PYSPARK_SUBMIT_ARGS")
    os.environ["PYSPARK_SUBMIT_ARGS"] = f"--properties-file {path} {before or 'pyspark-shell'}"
    try:
        session = builder.getOrCreate()
    finally:
        if before is None:
            del os.environ["PYSPARK_SUBMIT_ARGS"]
        else:
            os.environ["PYSPARK_SUBMIT_ARGS"] = before
        path.unlink(missing_ok=True)
    for key, value in secret.items():  # a session that was already running reads no file
        with contextlib.suppress(Exception):  # a static conf stays as it was
            if session.conf.get(key, None) != value:
                session.conf.set(key, value)
    return session  # type: ignore[no-any-return]


def _escaped(value: str) -> str:
    """A value as java.util.Properties reads it back."""
    value = value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    return "\\" + value if value[:1].isspace() else value


def views_session(spark: SparkSession, settings: Settings) -> SparkSession:
    """The session the views' streaming queries run in, one per Spark context (its
    queries and listeners are its own): the main session's, but with the state of a
    query started afresh in `apply.views_state_partitions` partitions (each is a task
    and a state store per stateful step and trigger; at 50 TPS one keeps up, and four
    cost the views two fifths more of the cores: docs/benchmarks.md)."""
    context: Any = spark.sparkContext
    held = getattr(context, "_cdc_views_session", None)
    if held is None:
        held = spark.newSession()
        held.conf.set("spark.sql.shuffle.partitions", str(settings.apply.views_state_partitions))
        context._cdc_views_session = held
    return cast("SparkSession", held)


# the environment variable naming where a driver writes its class archive as its JVM
# exits (cdc/core/class_archive.py builds it)
ARCHIVE_OUT = "CDC_SPARK_CLASS_ARCHIVE_OUT"
# the JVM's notes about the archive (one it cannot map, a class it skips) stay out of the
# command's output: the driver shares its standard output, a command's JSON
_ARCHIVE_QUIET = "-Xlog:cds=off,cds+dynamic=off"


def archive_path(settings: Settings) -> Path:
    """The Spark driver's class archive (cdc/core/class_archive.py)."""
    return settings.jvm_dir / "spark" / "driver-classes.jsa"


def archive_stamp(settings: Settings) -> str:
    """What a class archive is built for: the JDK, and the pyspark whose jars it loaded."""
    import pyspark

    return f"{settings.java_home.resolve()} pyspark {pyspark.__version__}"


def class_archive_options(settings: Settings) -> str:
    """The driver's JVM options for its class archive: write one (while install.sh
    builds it), map the one built for this JDK and pyspark, or none."""
    out = os.environ.get(ARCHIVE_OUT)
    if out:
        return f"-XX:ArchiveClassesAtExit={out} {_ARCHIVE_QUIET}"
    path = archive_path(settings)
    try:
        if not path.is_file() or path.with_suffix(".stamp").read_text().strip() != (
            archive_stamp(settings)
        ):
            return ""
    except OSError:
        return ""
    return f"-XX:SharedArchiveFile={path} {_ARCHIVE_QUIET}"


def spark_session(settings: Settings, app_name: str) -> SparkSession:
    """A Spark session with the Kafka source, Delta Lake and the PostgreSQL JDBC driver."""
    os.environ.setdefault("JAVA_HOME", str(settings.java_home))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    local_ip = driver_address(settings.spark.master, settings.spark.conf)
    if local_ip is not None:
        os.environ.setdefault("SPARK_LOCAL_IP", local_ip)
    log_config = settings.data_dir / "spark" / "log4j2.properties"
    prepare_job_state(settings)  # its folders, marked for `cdc down --purge`
    log_file = settings.data_dir / "spark" / "spark.log"
    _python_log(log_file.with_name("python.log"))
    written = log_config.with_name(f".{log_config.name}.{os.getpid()}")
    written.write_text(_LOG4J2.format(level=settings.spark.log_level.lower(), log=log_file))
    written.replace(log_config)  # whole, for another cdc process starting its Spark
    from pyspark.sql import SparkSession

    spark = settings.spark
    # the warehouse on object storage: its bucket checked (one line if it is not there or
    # refuses the credentials), Hadoop's S3A and its settings (cdc.core.object_store)
    # (and the checkpoints in a bucket: `[apply] checkpoints`, the same S3 settings)
    stores = [s for s in (warehouse_store(settings), checkpoint_store(settings)) if s]
    store_jars: list[Path] = []
    store_conf: dict[str, str] = {}
    for store in stores:
        store_jars = s3a_jars(settings.jvm_dir)
        check_bucket(store)
        store_conf = spark_s3_conf(store)
    builder = (
        SparkSession.builder.appName(app_name)
        .master(spark_master(spark.master))
        .config("spark.jars", jars_conf([*spark_jars(settings), *store_jars], spark.conf))
        .config("spark.driver.memory", spark.driver_memory)
        # a query stopped while its foreachBatch runs in Python checks the Python error's
        # text for an interruption with a regular expression, which overflows the default
        # thread stack on a long traceback (SPARK-48717's check): the thread then dies
        # printing a thousand-line StackOverflowError to the terminal (2 stops in 5 here)
        .config(
            "spark.driver.extraJavaOptions",
            f"-Dlog4j2.configurationFile=file:{log_config} -Xss16m "
            + class_archive_options(settings),
        )
        .config("spark.sql.shuffle.partitions", str(spark.shuffle_partitions))
        # the stores' queries share the cores: a store's small batch never waits for the
        # end of another store's large one (each query runs in a pool of its own)
        .config("spark.scheduler.mode", "FAIR")
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config(
            "spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"
        )
        # the code Spark generates for a plan is kept by its text; the warehouse's MERGEs,
        # per table and per step, generate more than the default 100 kept, so every batch
        # compiled them again (1,390 compilations where 177 differ, bench/batch_cost.py)
        .config("spark.sql.codegen.cache.maxEntries", "2000")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        # timestamps in Parquet as INT64 microseconds (Spark's default, INT96, is
        # deprecated in Parquet and outside Iceberg's spec: the warehouse's Iceberg
        # tables share the files)
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .config("spark.local.dir", str(settings.data_dir / "spark" / "tmp"))
        # each micro-batch writes two checkpoint files (its offsets, then its commit);
        # through Hadoop's FileSystem API (write a temporary file, rename it) each costs a
        # fifth of what the default FileContext one does (bench/results/checkpoint.jsonl)
        .config("spark.sql.streaming.checkpointFileManagerClass", CHECKPOINT_FILE_MANAGER)
        .config("spark.databricks.delta.snapshotPartitions", snapshot_partitions(spark))
    )
    # the user's spark.conf over the object store's settings
    confs = {**store_conf, **spark.conf}
    secret = {k: v for k, v in confs.items() if SECRET_KEY.search(k)}
    for key, value in confs.items():
        if key not in secret and key != "spark.jars":  # added to the project's (jars_conf)
            builder = builder.config(key, value)
    session = _with_secrets(builder, settings, secret)
    session.sparkContext.setLogLevel(spark.log_level)
    return session
