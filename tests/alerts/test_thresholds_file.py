"""The thresholds file: saved atomically, read only when safe, and followed by a monitor only from safe folders,
never above its root or in a shared folder."""

from __future__ import annotations

import json
import os
import stat
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest

from rnnmon.alerts.thresholds import Thresholds
from rnnmon.alerts.thresholds_file import THRESHOLDS_FILE, load_thresholds_file, save_thresholds_file, thresholds_files


def _load_within(path, seconds: float = 5.0):
    """load_thresholds_file(path) on a daemon thread: a hang fails the test instead of blocking it."""
    outcome: dict = {}

    def run():
        try:
            outcome["value"] = load_thresholds_file(path)
        except BaseException as error:
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"reading {path} hung"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def test_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / THRESHOLDS_FILE
    assert load_thresholds_file(path) is None
    thresholds = Thresholds.from_dict({"idle_gap": {"min_s": 3}, "gpu_throttled": {"reasons": ["hw_slowdown"]}})
    save_thresholds_file(path, thresholds)
    assert load_thresholds_file(path) == thresholds
    assert json.loads(path.read_text())["idle_gap"] == {"enabled": True, "min_s": 3}
    save_thresholds_file(str(path), Thresholds())  # replaces the old file
    assert load_thresholds_file(str(path)) == Thresholds()
    assert os.listdir(tmp_path) == [THRESHOLDS_FILE]
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_bad_file_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / THRESHOLDS_FILE
    path.write_text("{not json")
    with pytest.raises(ValueError, match=r"rnnmon_thresholds\.json is not valid JSON"):
        load_thresholds_file(path)
    path.write_text('{"gpu_util_low": {"pct": 150}}')
    with pytest.raises(ValueError, match=r"rnnmon_thresholds\.json: gpu_util_low\.pct must be in \[0, 100\]"):
        load_thresholds_file(path)


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_failed_save_leaves_the_old_file_and_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          failing: str) -> None:
    path = tmp_path / THRESHOLDS_FILE
    save_thresholds_file(path, Thresholds())
    before = path.read_bytes()

    def fail(*args: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, failing, fail)
    with pytest.raises(OSError, match="disk full"):
        save_thresholds_file(path, Thresholds.from_dict({"idle_gap": {"min_s": 1}}))
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == [THRESHOLDS_FILE]


def test_failed_first_save_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError):
        save_thresholds_file(tmp_path / THRESHOLDS_FILE, Thresholds())
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []


def test_fifo_is_refused_without_hanging(tmp_path):
    os.mkfifo(tmp_path / THRESHOLDS_FILE)
    with pytest.raises(ValueError, match="not a regular file"):
        _load_within(tmp_path / THRESHOLDS_FILE)


def test_symlink_is_refused_and_its_target_never_echoed(tmp_path):
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"password": "hunter2"}))
    (tmp_path / THRESHOLDS_FILE).symlink_to(secret)
    with pytest.raises(ValueError, match="symbolic link") as error:
        _load_within(tmp_path / THRESHOLDS_FILE)
    assert "hunter2" not in str(error.value) and "password" not in str(error.value)


def test_oversized_file_is_refused(tmp_path):
    (tmp_path / THRESHOLDS_FILE).write_text(" " * (17 << 10) + "{}")
    with pytest.raises(ValueError, match="larger than 16384 bytes"):
        _load_within(tmp_path / THRESHOLDS_FILE)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_file_of_another_user_is_refused(tmp_path):
    path = tmp_path / THRESHOLDS_FILE
    path.write_text(json.dumps(Thresholds().to_dict()))
    os.chown(path, 12345, 12345)
    with pytest.raises(ValueError, match="belongs to another user"):
        _load_within(path)


@pytest.mark.parametrize("value", [10**400, -(10**400)])
def test_out_of_range_numbers_get_the_schema_error(tmp_path, value):
    (tmp_path / THRESHOLDS_FILE).write_text(json.dumps({"gpu_util_low": {"pct": value}}))
    with pytest.raises(ValueError, match=r"gpu_util_low\.pct must be a finite number\. Received: \d*"):
        _load_within(tmp_path / THRESHOLDS_FILE)


def test_search_stops_short_of_the_temp_dir_and_at_the_root(tmp_path):
    shared = tempfile.mkdtemp()  # a folder right in the system's temp directory
    try:
        files = thresholds_files(os.path.join(shared, "exp"))
        assert os.path.join(tempfile.gettempdir(), THRESHOLDS_FILE) not in files
        assert files == [os.path.join(shared, "exp", THRESHOLDS_FILE), os.path.join(shared, THRESHOLDS_FILE)]
    finally:
        os.rmdir(shared)
    deep = tmp_path / "a" / "b" / "c"
    assert thresholds_files(str(deep), root=str(tmp_path / "a")) == [
        str(deep / THRESHOLDS_FILE), str(tmp_path / "a" / "b" / THRESHOLDS_FILE), str(tmp_path / "a" / THRESHOLDS_FILE)]
    assert thresholds_files(str(deep), root="/elsewhere") == [str(deep / THRESHOLDS_FILE)]


def test_world_writable_folder_is_not_searched(tmp_path):
    (tmp_path / "open").mkdir()
    os.chmod(tmp_path / "open", 0o777)
    files = thresholds_files(str(tmp_path / "open" / "exp"))
    assert files == [str(tmp_path / "open" / "exp" / THRESHOLDS_FILE)]


@pytest.mark.slow
@pytest.mark.usefixtures("no_nvml")
def test_a_bad_file_is_one_warning_and_the_thresholds_in_force_stay(tmp_path, caplog, traced_model):
    from conftest import read_run, stalled_dataset

    from rnnmon import UtilizationMonitor

    (tmp_path / THRESHOLDS_FILE).write_text('{"gpu_util_low": {"pct": 1' + "0" * 400 + "}}")  # OverflowError
    custom = {"gpu_util_low": {"pct": 12.0, "resolve_pct": 30.0, "for_s": 5.0}}
    traced_model.fit(stalled_dataset(12), epochs=1, verbose=0,
                     callbacks=[UtilizationMonitor(str(tmp_path), thresholds=custom, audit=False)])
    warnings = [r.getMessage() for r in caplog.records if r.name == "rnnmon" and r.levelname == "WARNING"
                and "thresholds file" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("rnnmon: ignoring the thresholds file:"), warnings
    info = read_run(str(tmp_path)).info
    assert info["status"] == "finished" and info["steps"] == 12  # monitoring stayed on
    assert info["thresholds_source"] == "callback" and info["thresholds"]["gpu_util_low"]["pct"] == 12.0
