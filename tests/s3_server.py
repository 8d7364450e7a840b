"""A local S3-compatible server for the tests: S3Proxy (org.gaul:s3proxy from Maven
Central, resolved by jvm/s3 into .cache/jvm/s3proxy) over a folder of a temporary
directory (jclouds' filesystem provider), on a free loopback port, with AWS v2/v4
signatures checked against a key pair of its own; stopped (its process group) at the end."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.helpers import ROOT, free_ports

JAR = ROOT / ".cache" / "jvm" / "s3proxy" / "s3proxy.jar"


@dataclass(frozen=True)
class S3Server:
    """A running S3Proxy: its endpoint, the key pair it accepts, and its folder."""

    endpoint: str
    access_key_id: str
    secret_access_key: str
    folder: Path

    def make_bucket(self, name: str) -> None:
        """A bucket, made through the S3 API (PUT Bucket)."""
        self.client(allow_bucket_creation=True).create_dir(name)

    def warehouse_env(self, bucket: str) -> dict[str, str]:
        """The CDC_* settings (and the AWS environment, as the SDKs take it) that put a
        pipeline's warehouse in `bucket` of this server."""
        return {
            "CDC_STORES__WAREHOUSE__PATH": f"s3://{bucket}/cdc",
            "CDC_STORES__WAREHOUSE__S3__ENDPOINT": self.endpoint,
            "CDC_STORES__WAREHOUSE__S3__PATH_STYLE": "true",
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
        }

    def delta_rs_options(self) -> dict[str, str]:
        """What a user gives delta-rs to read this server (the object_store crate's keys),
        not the pipeline's code."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
        }

    def client(self, **options: Any) -> Any:
        """A pyarrow S3 client of the server (path-style requests)."""
        from pyarrow import fs

        return fs.S3FileSystem(
            access_key=self.access_key_id,
            secret_key=self.secret_access_key,
            endpoint_override=self.endpoint.removeprefix("http://"),
            scheme="http",
            region="us-east-1",
            force_virtual_addressing=False,
            **options,
        )


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    assert found, "no java on PATH for S3Proxy"
    return found


@contextlib.contextmanager
def s3_server() -> Iterator[S3Server]:
    """S3Proxy on a free loopback port in a temporary directory, up until the end."""
    assert JAR.exists(), f"S3Proxy is not installed ({JAR}): run ./install.sh"
    work = Path(tempfile.mkdtemp(prefix="cdc-test-s3-"))
    (work / "data").mkdir()
    (port,) = free_ports(1)
    server = S3Server(
        endpoint=f"http://127.0.0.1:{port}",
        access_key_id=f"test{uuid.uuid4().hex[:12]}",
        secret_access_key=uuid.uuid4().hex,
        folder=work / "data",
    )
    conf = work / "s3proxy.conf"
    conf.write_text(
        f"s3proxy.endpoint={server.endpoint}\n"
        "s3proxy.authorization=aws-v2-or-v4\n"
        f"s3proxy.identity={server.access_key_id}\n"
        f"s3proxy.credential={server.secret_access_key}\n"
        "jclouds.provider=filesystem\n"
        f"jclouds.filesystem.basedir={server.folder}\n"
    )
    conf.chmod(0o600)
    log = (work / "s3proxy.log").open("wb")
    process = subprocess.Popen(
        [_java(), "-Xmx256m", "-jar", str(JAR), "--properties", str(conf)],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        cwd=work,
    )
    try:
        deadline = time.monotonic() + 60
        import socket

        while True:
            if process.poll() is not None:
                raise AssertionError(
                    f"S3Proxy exited ({process.returncode}): "
                    + (work / "s3proxy.log").read_text()[-2000:]
                )
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            assert time.monotonic() < deadline, "S3Proxy did not listen within 60 s"
            time.sleep(0.2)
        yield server
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()
        shutil.rmtree(work, ignore_errors=True)
