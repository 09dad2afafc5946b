"""A throwaway PostgreSQL server for the tests: started on a free port of 127.0.0.1 (and a unix
socket in its own temporary directory), as an unprivileged user, stopped and deleted after.

As root (CI here), the server runs as the `postgres` user the Debian package creates, else as
`autoplan-pg`, created with useradd; `initdb` refuses to run as root. `.ci/run` installs the
Debian package where it is missing. Run `python -m tests.pg_server` to start one by hand: it
prints the URL and stops on Ctrl-C.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

DB_USER = "autoplan"
"""The database superuser initdb creates (trust authentication, loopback only)."""
START_TIMEOUT_S = 60.0


class Unavailable(RuntimeError):
    """No PostgreSQL server can be started here (binaries or the driver missing)."""


def _bin_dir() -> Path:
    found = shutil.which("initdb")
    if found:
        return Path(os.path.realpath(found)).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                      key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    if versions:
        return Path(versions[-1]).parent
    raise Unavailable("no initdb on PATH or in /usr/lib/postgresql/*/bin "
                      "(Debian: apt-get install postgresql)")


def _os_user() -> pwd.struct_passwd | None:
    """The unprivileged account to run the server as when we are root; None when we are not."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "autoplan-pg"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                    "autoplan-pg"], check=True, capture_output=True)
    return pwd.getpwnam("autoplan-pg")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """A running server; `url(db)` is an SQLAlchemy URL for one of its databases."""

    port: int
    root: Path
    proc: subprocess.Popen[bytes]
    databases: list[str] = field(default_factory=list)

    def url(self, database: str) -> str:
        return f"postgresql://{DB_USER}@127.0.0.1:{self.port}/{database}"
    def create_database(self, name: str) -> str:
        """Create an empty database and return its URL."""
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user=DB_USER, dbname="postgres",
                             autocommit=True) as con:
            con.execute(f'CREATE DATABASE "{name}"'.encode())  # a name the tests chose
        self.databases.append(name)
        return self.url(name)

    def stop(self) -> None:
        """Fast shutdown (SIGINT), then delete the data directory."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def _ready(port: int) -> bool:
    import psycopg

    try:
        psycopg.connect(host="127.0.0.1", port=port, user=DB_USER, dbname="postgres",
                        connect_timeout=2).close()
        return True
    except psycopg.OperationalError:
        return False


def start() -> Server:
    """Initialise a cluster in a new temporary directory and start a server on it."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        raise Unavailable("the PostgreSQL driver is missing (pip install -e '.[test]' "
                          "installs psycopg[binary])") from None
    bin_dir = _bin_dir()
    user = _os_user()
    root = Path(tempfile.mkdtemp(prefix="autoplan-pg-"))
    as_user: dict[str, int] = {}
    if user is not None:
        os.chown(root, user.pw_uid, user.pw_gid)
        as_user = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
    data, log = root / "data", root / "server.log"
    try:
        subprocess.run([str(bin_dir / "initdb"), "-D", str(data), "-U", DB_USER, "--auth=trust",
                        "-E", "UTF8", "--no-sync"], check=True, capture_output=True,
                       cwd=root, **as_user)
        port = _free_port()
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [str(bin_dir / "postgres"), "-D", str(data), "-p", str(port),
                 "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={root}",
                 "-c", "fsync=off", "-c", "synchronous_commit=off",
                 "-c", "full_page_writes=off", "-c", "max_connections=50"],
                stdout=out, stderr=subprocess.STDOUT, cwd=root, **as_user)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _ready(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill() if proc.poll() is None else None
                raise Unavailable(f"the server did not start: {log.read_text()[-600:]}")
            time.sleep(0.1)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return Server(port, root, proc)


if __name__ == "__main__":
    server = start()
    print(server.create_database("autoplan"), flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


def server_or_skip() -> Iterator[Server]:
    """A throwaway server for a pytest fixture (`yield from server_or_skip()`): the test is
    skipped where none can start, and fails instead under CI=true or AUTOPLAN_REQUIRE_POSTGRES,
    where PostgreSQL is part of the job; the server stops when the fixture ends."""
    import pytest

    try:
        server = start()
    except Unavailable as err:
        if os.environ.get("CI") == "true" or os.environ.get("AUTOPLAN_REQUIRE_POSTGRES"):
            pytest.fail(f"PostgreSQL is required here and could not start: {err}")
        pytest.skip(str(err))
    try:
        yield server
    finally:
        server.stop()
