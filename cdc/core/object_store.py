"""The warehouse on object storage: `[stores.warehouse] path = "s3://bucket/prefix"` and
`[stores.warehouse.s3]` (endpoint, region, path-style requests, credentials), given to
every engine that touches the warehouse in its own words:

- Spark (the apply job's writes, `cdc query`, `cdc verify`, repair): Hadoop's S3A
  filesystem (`spark.hadoop.fs.s3a.*`, its jars from the install step in
  .cache/jvm/spark/s3a-jars), `s3://` and `s3a://` both served by it, and Delta's S3 log
  store, which is safe for one writing driver only (docs/operations.md);
- delta-rs, a reader of the user's own (Polars, a notebook): `storage_options`, the
  object_store crate's AWS_* keys, which `cdc config` shows (the secret masked).

A key not set in the settings is taken from the AWS environment (AWS_ENDPOINT_URL,
AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY). The secret key is never printed:
Spark gets it through its properties file (cdc.core.spark), and no error here names it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from cdc.core.errors import ConfigError, NotInstalledError, StoreUnavailableError

__all__ = [
    "S3_SCHEMES",
    "ObjectStore",
    "check_bucket",
    "delta_rs_options",
    "object_store",
    "object_store_at",
    "pyarrow_s3",
    "s3a_jars",
    "spark_s3_conf",
]

S3_SCHEMES = ("s3", "s3a", "s3n")
_S3A = "org.apache.hadoop.fs.s3a.S3AFileSystem"


@dataclass(frozen=True)
class ObjectStore:
    """The warehouse's bucket and how it is reached, settings and environment resolved."""

    bucket: str
    prefix: str
    endpoint: str | None
    region: str
    path_style: bool
    access_key_id: str | None
    secret_access_key: str | None

    @property
    def where(self) -> str:
        """The bucket as an error names it: its URL and endpoint, never a credential."""
        return f"s3://{self.bucket} at {self.endpoint or 'AWS S3'}"

    @property
    def insecure(self) -> bool:
        return bool(self.endpoint) and str(self.endpoint).startswith("http://")


def object_store(section: Any) -> ObjectStore | None:
    """The object store of a warehouse's section (its `path` and `s3`:
    cdc.core.state_folders.warehouse_store), or None: its path is not s3://, s3a://, s3n://."""
    return object_store_at(section.path, section.s3, "[stores.warehouse] path")


def object_store_at(where: str | None, s3: Any, setting: str) -> ObjectStore | None:
    """The object store of the URL `where` (the setting `setting` names it), reached with
    the S3 settings `s3` ([stores.warehouse.s3]); None: `where` is not an S3 URL."""
    url = urlparse(where or "")
    if url.scheme not in S3_SCHEMES:
        return None
    if not url.netloc:
        raise ConfigError(f"{setting} {where!r} names no bucket: write s3://bucket/prefix")
    secret = s3.secret_access_key.get_secret_value() if s3.secret_access_key else None
    return ObjectStore(
        bucket=url.netloc,
        prefix=url.path.strip("/"),
        endpoint=(s3.endpoint or os.environ.get("AWS_ENDPOINT_URL") or None),
        region=s3.region or os.environ.get("AWS_REGION") or "us-east-1",
        path_style=s3.path_style,
        access_key_id=s3.access_key_id or os.environ.get("AWS_ACCESS_KEY_ID") or None,
        secret_access_key=secret or os.environ.get("AWS_SECRET_ACCESS_KEY") or None,
    )


def spark_s3_conf(store: ObjectStore) -> dict[str, str]:
    """Spark's settings for the store: S3A for s3:// and s3a:// alike, its endpoint,
    region, path style and credentials (the secret key among them: give it as a secret)."""
    conf = {
        "spark.hadoop.fs.s3a.impl": _S3A,
        "spark.hadoop.fs.s3.impl": _S3A,
        "spark.hadoop.fs.s3n.impl": _S3A,
        "spark.hadoop.fs.s3a.endpoint.region": store.region,
        "spark.hadoop.fs.s3a.path.style.access": str(store.path_style).lower(),
        # a missing bucket is told at once (check_bucket says it first, in one line)
        "spark.hadoop.fs.s3a.bucket.probe": "0",
        # Delta's log store for these schemes: one writing driver (docs/operations.md)
        "spark.delta.logStore.s3.impl": "io.delta.storage.S3SingleDriverLogStore",
        "spark.delta.logStore.s3a.impl": "io.delta.storage.S3SingleDriverLogStore",
        "spark.delta.logStore.s3n.impl": "io.delta.storage.S3SingleDriverLogStore",
    }
    if store.endpoint:
        conf["spark.hadoop.fs.s3a.endpoint"] = store.endpoint
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(not store.insecure).lower()
    if store.access_key_id and store.secret_access_key:
        conf["spark.hadoop.fs.s3a.aws.credentials.provider"] = (
            "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
        )
        conf["spark.hadoop.fs.s3a.access.key"] = store.access_key_id
        conf["spark.hadoop.fs.s3a.secret.key"] = store.secret_access_key
    return conf


def delta_rs_options(store: ObjectStore) -> dict[str, str]:
    """delta-rs's `storage_options` for reading the store's tables (the object_store
    crate's AWS keys), as `cdc config` shows them. No locking provider: the pipeline's
    one writer on S3 is Spark in its apply job's driver, and a writer of the user's own
    needs a lock that both share (docs/operations.md, "One writer")."""
    options = {
        "AWS_REGION": store.region,
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": str(not store.path_style).lower(),
    }
    if store.endpoint:
        options["AWS_ENDPOINT_URL"] = store.endpoint
        if store.insecure:
            options["AWS_ALLOW_HTTP"] = "true"
    if store.access_key_id and store.secret_access_key:
        options["AWS_ACCESS_KEY_ID"] = store.access_key_id
        options["AWS_SECRET_ACCESS_KEY"] = store.secret_access_key
    return options


def s3a_jars(jvm_dir: Path) -> list[Path]:
    """Hadoop's S3A filesystem and the AWS SDK it is built against (install step 4)."""
    folder = jvm_dir / "spark" / "s3a-jars"
    jars = sorted(folder.glob("*.jar"))
    if not any(j.name.startswith("hadoop-aws-") for j in jars):
        raise NotInstalledError(
            f"the warehouse is on object storage but Spark's S3 connector is not installed "
            f"(no hadoop-aws in {folder}): run `make install-s3` (CDC_INSTALL_S3=1 ./install.sh)"
        )
    return jars


def pyarrow_s3(store: ObjectStore) -> Any:
    """Arrow's S3 filesystem for the store: the driver's own reads of what Spark writes
    there (a streaming query's checkpoint), and the bucket check."""
    from pyarrow import fs

    # the checksums the AWS SDK adds to every request and checks on every response since
    # 2025 only where S3 requires them: S3-compatible servers (S3Proxy, Ceph, an older
    # MinIO) refuse or garble them (a read fails "Failed to flush response stream"); the
    # SDK reads these when the client is made, and a user's own choice stands
    for checksums in ("AWS_REQUEST_CHECKSUM_CALCULATION", "AWS_RESPONSE_CHECKSUM_VALIDATION"):
        os.environ.setdefault(checksums, "when_required")
    endpoint = urlparse(store.endpoint) if store.endpoint else None
    return fs.S3FileSystem(
        access_key=store.access_key_id,
        secret_key=store.secret_access_key,
        region=store.region,
        scheme=endpoint.scheme if endpoint else "https",
        endpoint_override=endpoint.netloc if endpoint else None,
        force_virtual_addressing=not store.path_style,
        connect_timeout=5,
        request_timeout=20,
        retry_strategy=fs.AwsStandardS3RetryStrategy(max_attempts=2),
    )


def check_bucket(store: ObjectStore) -> None:
    """Raise one line when the bucket is not there, the credentials are refused, or the
    endpoint does not answer; return when the bucket can be listed."""
    from pyarrow import fs

    client = pyarrow_s3(store)
    try:
        info = client.get_file_info(store.bucket)
    except OSError as exc:
        said = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if store.secret_access_key:
            said = said.replace(store.secret_access_key, "**********")
        lowered = said.lower()
        if any(
            word in lowered
            for word in ("access_denied", "accessdenied", "invalidaccesskeyid", "signature", "403")
        ):
            key = store.access_key_id or "(none: the AWS SDK's own chain)"
            raise ConfigError(
                f"the warehouse's object store refused the credentials for {store.where} "
                f"(access key id {key}): set [stores.warehouse.s3] access_key_id and "
                "secret_access_key, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
            ) from None
        if any(word in lowered for word in ("nosuchbucket", "no such bucket", "404")):
            info = None
        else:
            raise StoreUnavailableError(
                f"the warehouse's object store {store.where} does not answer: {said[:300]}"
            ) from None
    if info is None or info.type == fs.FileType.NotFound:
        raise ConfigError(
            f"the warehouse's bucket {store.where} does not exist: create it, or set "
            "[stores.warehouse] path to one that does"
        )
