"""Files apexrl writes: temporaries created exclusively, never through a symbolic link, 0600;
run directories 0700."""

from __future__ import annotations

import os
import stat

import pytest

from apexrl.apex.metrics import CSVWriter, read_csv
from apexrl.durable import create_private, make_private_dirs, write_atomically


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_link_planted_at_the_temporary_name_is_replaced_not_followed(tmp_path):
    """Another user who could guess ``<path>.tmp.<pid>`` and plant a link there must not make apexrl write
    through it: the victim file stays as it was, the new file is 0600."""
    victim = tmp_path / "victim"
    victim.write_text("precious", encoding="utf-8")
    path = tmp_path / "checkpoint.bin"
    os.symlink(victim, f"{path}.tmp.{os.getpid()}")
    write_atomically(path, b"new")
    assert victim.read_text(encoding="utf-8") == "precious"
    assert path.read_bytes() == b"new" and _mode(path) == 0o600
    assert not os.path.lexists(f"{path}.tmp.{os.getpid()}")


def test_create_private_is_exclusive_and_0600_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        fd = create_private(tmp_path / "a")
    finally:
        os.umask(old)
    os.close(fd)
    assert _mode(tmp_path / "a") == 0o600
    os.symlink(tmp_path / "elsewhere", tmp_path / "link")
    os.close(create_private(tmp_path / "link"))  # the link is replaced by a regular file; nothing created elsewhere
    assert not os.path.islink(tmp_path / "link") and not os.path.exists(tmp_path / "elsewhere")


def test_run_directories_are_created_0700_and_existing_ones_keep_their_mode(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    make_private_dirs(shared / "runs" / "gym-CartPole-v1" / "dqn")
    assert _mode(shared) == 0o755
    for d in (shared / "runs", shared / "runs" / "gym-CartPole-v1", shared / "runs" / "gym-CartPole-v1" / "dqn"):
        assert _mode(d) == 0o700, d
    (tmp_path / "file").write_text("x", encoding="utf-8")
    with pytest.raises(FileExistsError):
        make_private_dirs(tmp_path / "file")


def test_metrics_csv_is_private_and_its_header_upgrade_goes_through_a_private_temporary(tmp_path):
    path = tmp_path / "run" / "metrics.csv"
    w = CSVWriter(str(path), ["a", "b"])
    w.write({"a": 1, "b": 2})
    w.close()
    assert _mode(tmp_path / "run") == 0o700 and _mode(path) == 0o600
    w = CSVWriter(str(path), ["a", "b", "c"])  # an older file: rewritten with the new header
    w.write({"a": 3, "c": 4})
    w.close()
    assert _mode(path) == 0o600
    cols = read_csv(str(path))
    assert cols["a"] == [1, 3] and cols["b"][0] == 2 and cols["c"][1] == 4
