"""Root writes into folders the service user owns, and that user may have been there
first: a link left where a config, a secret, a log or a pid file goes must not make
root write, chown or chmod a file of that user's choosing, nor signal a process it names
(cdc/core/files.py). Each case runs as root with a service user the test creates, who plants
the link or the forged file itself; without root (or useradd) they are skipped."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdc.capture.role import write_secret
from cdc.core.errors import ComponentError
from cdc.core.files import write_file
from cdc.core.settings import Settings, local_admin_password
from cdc.stack.components.opensearch import OpenSearch
from cdc.stack.components.postgres import Postgres
from cdc.stack.process import ServiceUser, spawn

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None, reason="needs root and useradd"
)


@pytest.fixture(scope="module")
def intruder() -> Iterator[ServiceUser]:
    """A new unprivileged user: the service user whom a local user became."""
    name = f"probe{uuid.uuid4().hex[:8]}"
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        check=True,
    )
    try:
        user = ServiceUser.lookup(name)
        assert user is not None
        yield user
    finally:
        subprocess.run(["userdel", name], check=False)


def as_user(user: ServiceUser, *argv: str) -> None:
    subprocess.run(list(argv), check=True, user=user.uid, group=user.gid, extra_groups=[])


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A folder the intruder may pass through (pytest's own are root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="cdc-files-"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """Root's file, which no one else may read or change."""
    folder = tmp_path / "root-only"
    folder.mkdir(mode=0o755)
    path = folder / "secret"
    path.write_text("original\n")
    path.chmod(0o600)
    return path


def untouched(path: Path) -> bool:
    info = path.stat()
    return path.read_text() == "original\n" and (info.st_uid, info.st_mode & 0o777) == (0, 0o600)


def settings_for(tmp_path: Path, user: ServiceUser) -> Settings:
    data_dir = tmp_path / "data"
    data_dir.mkdir(exist_ok=True)
    data_dir.chmod(0o755)
    return Settings(data_dir=data_dir, service_user=user.name)


def service_folder(path: Path, user: ServiceUser) -> Path:
    """`path`, and each folder between the data folder (`<tmp>/data`) and it, the user's."""
    path.mkdir(parents=True, exist_ok=True)
    data_dir = next(p for p in path.parents if p.name == "data" and p.parent.name != "data")
    data_dir.chmod(0o755)
    for folder in [path, *path.parents]:
        if folder == data_dir:
            break
        os.chown(folder, user.uid, user.gid)
    return path


def test_pg_hba_conf_linked_to_roots_file_is_replaced_not_written_through(
    tmp_path: Path, intruder: ServiceUser, victim: Path
) -> None:
    postgres = Postgres(settings_for(tmp_path, intruder))
    service_folder(postgres.data_path, intruder)
    hba = postgres.data_path / "pg_hba.conf"
    as_user(intruder, "ln", "-s", str(victim), str(hba))
    postgres._write_hba(tls=False)
    assert untouched(victim)
    assert not hba.is_symlink() and "scram-sha-256" in hba.read_text()
    assert (hba.stat().st_uid, hba.stat().st_mode & 0o777) == (intruder.uid, 0o600)


def test_a_folder_swapped_for_a_link_is_refused(
    tmp_path: Path, intruder: ServiceUser, victim: Path
) -> None:
    postgres = Postgres(settings_for(tmp_path, intruder))
    service_folder(postgres.state_dir, intruder)
    as_user(intruder, "ln", "-s", str(victim.parent), str(postgres.data_path))
    with pytest.raises(ComponentError, match="symbolic link"):
        postgres._write_hba(tls=False)
    assert untouched(victim) and sorted(os.listdir(victim.parent)) == ["secret"]


def test_a_secret_file_linked_to_roots_file_is_replaced(
    tmp_path: Path, intruder: ServiceUser, victim: Path
) -> None:
    secrets = service_folder(tmp_path / "data" / "connect" / "secrets", intruder)
    as_user(intruder, "ln", "-s", str(victim), str(secrets / "cdc.properties"))
    write_secret(secrets / "cdc.properties", "database.password=x\n")
    assert untouched(victim)
    assert (secrets / "cdc.properties").stat().st_uid == intruder.uid  # the reader's


def test_opensearch_configs_linked_to_roots_files_are_replaced(
    tmp_path: Path, intruder: ServiceUser, victim: Path
) -> None:
    opensearch = OpenSearch(settings_for(tmp_path, intruder))
    try:
        opensearch.check_installed()
    except Exception:
        pytest.skip("OpenSearch is not installed")
    conf = service_folder(opensearch.state_dir / "config", intruder)
    for name in ("jvm.options", "opensearch.yml", "log4j2.properties"):
        as_user(intruder, "ln", "-sf", str(victim), str(conf / name))
    opensearch.prepare()
    assert untouched(victim)
    assert not any((conf / n).is_symlink() for n in ("jvm.options", "opensearch.yml"))


def test_a_log_linked_elsewhere_is_refused_and_nothing_is_made_there(
    tmp_path: Path, intruder: ServiceUser
) -> None:
    logs = service_folder(tmp_path / "data" / "postgres", intruder)
    target = tmp_path / "profile.d" / "x.sh"  # does not exist: root would create it
    target.parent.mkdir()
    (tmp_path / "run").mkdir()
    as_user(intruder, "ln", "-s", str(target), str(logs / "postgres.log"))
    with pytest.raises(ComponentError, match="symbolic link"):
        spawn(
            ["true"],
            log_file=logs / "postgres.log",
            pid_file=tmp_path / "run" / "p.pid",
            cwd=tmp_path,
        )
    assert not target.exists()


def test_owning_a_tree_never_follows_a_link_out_of_it(
    tmp_path: Path, intruder: ServiceUser, victim: Path
) -> None:
    tree = service_folder(tmp_path / "data" / "opensearch", intruder)
    as_user(intruder, "mkdir", str(tree / "sub"))
    as_user(intruder, "ln", "-s", str(victim), str(tree / "sub" / "link"))
    as_user(intruder, "ln", "-s", str(victim.parent), str(tree / "dirlink"))
    intruder.own(tree)
    assert untouched(victim) and victim.parent.stat().st_uid == 0
    assert (tree / "sub").stat().st_uid == intruder.uid


def test_a_pid_file_the_service_user_forged_signals_nothing(
    tmp_path: Path, intruder: ServiceUser
) -> None:
    """The start time of any process is world-readable: a pid file that names it
    would have made root's `cdc down` kill it."""
    opensearch = OpenSearch(settings_for(tmp_path, intruder))
    folder = service_folder(opensearch.state_dir, intruder)
    bystander = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        started = Path(f"/proc/{bystander.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
        forged = f"{bystander.pid} {started}"
        as_user(intruder, "sh", "-c", f"echo {forged} > {folder / 'opensearch.pid'}")
        assert opensearch.pid() is None
        assert opensearch.stop() is False
        assert bystander.poll() is None  # still running
    finally:
        os.killpg(bystander.pid, signal.SIGKILL)
        bystander.wait()


def test_a_root_written_pid_file_from_before_is_still_believed(tmp_path: Path) -> None:
    """A stack started by a cdc that kept pid files in the state folders stops."""
    opensearch = OpenSearch(Settings(data_dir=tmp_path))
    opensearch.state_dir.mkdir(parents=True)
    sleeper = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        started = Path(f"/proc/{sleeper.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
        write_file(opensearch.state_dir / "opensearch.pid", f"{sleeper.pid} {started}\n")
        assert opensearch.pid() == sleeper.pid
    finally:
        os.killpg(sleeper.pid, signal.SIGKILL)
        sleeper.wait()


def test_the_local_superuser_password_is_generated_with_its_cluster(tmp_path: Path) -> None:
    """No local user logs in as the superuser with a password everyone knows."""
    postgres = Postgres(Settings(data_dir=tmp_path / "new"))
    postgres._generate_password()  # as a new cluster is made, before initdb
    password = postgres.section.password.get_secret_value()
    assert password != "postgres" and len(password) >= 24
    kept = tmp_path / "new" / "secrets" / "postgres.password"
    assert (kept.stat().st_mode & 0o777, kept.parent.stat().st_mode & 0o777) == (0o600, 0o700)
    again = local_admin_password(Settings(data_dir=tmp_path / "new"))
    assert again.postgres.password.get_secret_value() == password
    # a cluster made before keeps its password; a configured one is the configured one
    old = local_admin_password(Settings(data_dir=tmp_path / "old"))
    assert old.postgres.password.get_secret_value() == "postgres"
    mine = Postgres(Settings(data_dir=tmp_path / "mine", postgres={"password": "mine"}))  # type: ignore[arg-type]
    mine._generate_password()
    assert mine.section.password.get_secret_value() == "mine"
    assert not (tmp_path / "mine").exists()
