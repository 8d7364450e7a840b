"""Helpers shared by the components that run on the JVM."""

from __future__ import annotations

from pathlib import Path

from cdc.core.errors import INSTALL_HINT, NotInstalledError
from cdc.core.files import private_folder, write_file
from cdc.core.settings import Settings

LOG4J2_PROPERTIES = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c{1})%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
logger.reflections.name = org.reflections
logger.reflections.level = ERROR
logger.zookeeper.name = org.apache.zookeeper
logger.zookeeper.level = WARN
"""


def java(settings: Settings) -> str:
    binary = settings.java_home / "bin" / "java"
    if not binary.exists():
        raise NotInstalledError(
            f"no java at {binary}: set java_home (CDC_JAVA_HOME) to a JDK 17+ home"
        )
    return str(binary)


def heap_flags(heap: str) -> list[str]:
    return [f"-Xms{heap}", f"-Xmx{heap}"]


def kafka_lib(settings: Settings) -> Path:
    lib = settings.jvm_dir / "kafka" / "lib"
    if not any(lib.glob("kafka_2.13-*.jar")):
        raise NotInstalledError(f"kafka is not installed (no jars in {lib}): {INSTALL_HINT}")
    return lib


def jar_version(lib: Path, prefix: str) -> str | None:
    """The version in a jar file name such as kafka_2.13-4.3.1.jar."""
    for jar in lib.glob(f"{prefix}-*.jar"):
        rest = jar.name[len(prefix) + 1 : -len(".jar")]
        if rest[:1].isdigit():
            return rest
    return None


def write_properties(path: Path, values: dict[str, object], mode: int = 0o600) -> None:
    write_file(path, "".join(f"{key}={value}\n" for key, value in values.items()), mode)


def write_secret_properties(path: Path, values: dict[str, str]) -> None:
    """A Java properties file that holds secrets (read through Kafka's FileConfigProvider,
    `${file:path:key}`): mode 0600 in a folder of mode 0700, values escaped as
    java.util.Properties reads them."""
    text = "".join(f"{key}={_escaped(value)}\n" for key, value in values.items())
    write_private(path, text.encode())


def write_private(path: Path, data: bytes) -> None:
    """Write a file of mode 0600 (also when it was there before) in a folder of mode 0700."""
    private_folder(path.parent)
    write_file(path, data)


def _escaped(value: str) -> str:
    value = value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    return "\\" + value if value[:1].isspace() else value
