"""The data folder and the SQLite database are created private (issue 21.5): the folder holds the
secret key, the database (password hashes, webhook secrets) and the workspaces."""
import os
import stat
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# a connection that writes: SQLite makes the file, then its -wal and -shm companions
WRITE = ("import django; django.setup(); from django.db import connection; c = connection.cursor(); "
         "c.execute('CREATE TABLE t (x)'); c.execute('INSERT INTO t VALUES (1)')")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _start(data_dir: Path) -> None:
    environ = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "VERONICA_SQLITE_PATH")}
    environ.update(VERONICA_DATA_DIR=str(data_dir), DJANGO_SETTINGS_MODULE="veronica.settings")
    result = subprocess.run([sys.executable, "-c", WRITE], cwd=REPO, env=environ, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


def test_a_new_data_folder_and_sqlite_database_are_owner_only_whatever_the_umask(tmp_path):
    data = tmp_path / "fresh" / "data"
    old = os.umask(0o022)  # the common default, inherited by the child
    try:
        _start(data)
    finally:
        os.umask(old)
    assert _mode(data) == 0o700
    assert _mode(data / "secret_key") == 0o600
    for name in ("veronica.sqlite3", "veronica.sqlite3-wal", "veronica.sqlite3-shm"):
        if (data / name).exists() or name == "veronica.sqlite3":
            assert _mode(data / name) == 0o600, (name, oct(_mode(data / name)))


def test_an_existing_folder_and_database_keep_the_modes_their_owner_chose(tmp_path):
    data = tmp_path / "data"
    data.mkdir(mode=0o750)
    data.chmod(0o750)
    (data / "veronica.sqlite3").touch()
    (data / "veronica.sqlite3").chmod(0o640)
    _start(data)
    assert _mode(data) == 0o750 and _mode(data / "veronica.sqlite3") == 0o640
