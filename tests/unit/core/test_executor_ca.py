"""The CA files of Kafka and PostgreSQL reach Spark's executors: on a cluster (a master
that is not local) they travel in the options as PEM text, since the executors' machines
have no copy of the file; on a local master the path is given, as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc.core.errors import ConfigError
from cdc.core.settings import Settings, load_settings
from cdc.core.spark import jdbc_ssl_options, kafka_options

PEM = "-----BEGIN CERTIFICATE-----\nMIIBtest\n-----END CERTIFICATE-----\n"


def _settings(tmp_path: Path, master: str, pem: str = PEM) -> Settings:
    ca = tmp_path / "ca.crt"
    ca.write_text("# the test's CA\n" + pem)
    return load_settings(
        spark={"master": master},
        kafka={"security_protocol": "SSL", "ca_file": str(ca), "managed": False},
        postgres={"sslmode": "verify-full", "ca_file": str(ca), "managed": False},
    )


def test_on_a_cluster_the_cas_travel_as_their_text(tmp_path: Path) -> None:
    settings = _settings(tmp_path, "spark://spark-master:7077")
    kafka = kafka_options(settings)
    assert "kafka.ssl.truststore.location" not in kafka
    assert kafka["kafka.ssl.truststore.type"] == "PEM"
    assert kafka["kafka.ssl.truststore.certificates"] == "# the test's CA\n" + PEM
    jdbc = jdbc_ssl_options(settings)
    assert jdbc == {
        "sslmode": "verify-full",
        "sslfactory": "org.postgresql.ssl.SingleCertValidatingFactory",
        "sslfactoryarg": PEM.strip(),  # from its first line: the driver reads it so
    }


def test_on_a_local_master_the_paths_are_given(tmp_path: Path) -> None:
    settings = _settings(tmp_path, "local[2]")
    ca = str(tmp_path / "ca.crt")
    assert kafka_options(settings)["kafka.ssl.truststore.location"] == ca
    assert jdbc_ssl_options(settings) == {"sslmode": "verify-full", "sslrootcert": ca}


def test_a_ca_file_the_executors_cannot_be_given_is_refused_in_one_line(tmp_path: Path) -> None:
    settings = _settings(tmp_path, "spark://m:7077", pem=PEM + PEM)
    with pytest.raises(ConfigError, match="more than one certificate"):
        jdbc_ssl_options(settings)
    (tmp_path / "ca.crt").write_text("not a certificate")
    with pytest.raises(ConfigError, match="holds no PEM certificate"):
        kafka_options(settings)
    (tmp_path / "ca.crt").unlink()
    with pytest.raises(ConfigError, match="cannot be read"):
        kafka_options(settings)
