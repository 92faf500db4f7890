"""The staging folder of an `s3://` or `gs://` log directory, and the mirror's cache: private folders of this user,
whose regular files only are uploaded (a link, a FIFO or a device planted there is never read)."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from conftest import TESTS
from object_stores import ObjectStore

from rnnmon.format import schema
from rnnmon.format.writer import SummaryWriter
from rnnmon.storage import remote, uploader

PRIVATE = b"a private file's bytes"


@pytest.mark.slow
def test_only_the_staging_folders_regular_files_are_uploaded(tmp_path, monkeypatch, caplog):
    """A link planted in the staging folder used to have its target uploaded; a FIFO blocked the upload thread (the
    process was still alive 144 s after `fit`); a link to a sparse 2 GiB file cost the process 2.9 GB."""
    with ObjectStore("s3") as server:
        for name, value in server.env.items():
            monkeypatch.setenv(name, value)
        server.make_bucket()
        run_dir = str(tmp_path / "staging" / "rnnmon")
        writer = SummaryWriter(run_dir)
        writer.table(schema.STEPS_TAG, np.array([[1, 0, 1000.0, 1000.01, 1.0, 0.5, 1]], dtype=np.float64))
        writer.close()
        (tmp_path / "private.txt").write_bytes(PRIVATE)
        with open(tmp_path / "sparse", "wb") as f:
            f.truncate(2 << 30)
        os.symlink(tmp_path / "private.txt", os.path.join(run_dir, "planted.txt"))
        os.symlink(tmp_path / "sparse", os.path.join(run_dir, "big"))
        os.mkfifo(os.path.join(run_dir, "pipe"))
        up = uploader.Uploader(run_dir, server.url("run/rnnmon"), interval_s=0.0)
        finished = []
        thread = threading.Thread(target=lambda: finished.append(up._pass(final=True)), daemon=True)
        thread.start()
        thread.join(60)  # a FIFO opened blocking: never returns
        assert finished == [True]
        fs, root = remote.filesystem(server.url("run/rnnmon"))
        uploaded = {path[len(root):].strip("/") for path in fs.find(root)}
        assert any("tfevents" in rel for rel in uploaded), uploaded
        assert not uploaded & {"planted.txt", "big", "pipe"}
        assert not any(fs.cat(root + "/" + rel) == PRIVATE for rel in uploaded)
        refused = [r.getMessage() for r in caplog.records if "is not uploaded" in r.getMessage()]
        assert len(refused) == 3, refused


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a folder to another user")
@pytest.mark.parametrize("kind", ["staging", "cache"])
def test_staging_and_cache_folders_are_private_and_another_users_is_refused(tmp_path, kind):
    """The default base `<tmp>/rnnmon-staging` is predictable: it was used even when another user had made it
    (mode 1777 in the probe)."""
    base = str(tmp_path / f"rnnmon-{kind}")
    folder = remote.local_folder(kind, "s3://bucket/exp1", base)
    for path in (base, folder):
        info = os.lstat(path)
        assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.getuid()
    planted = str(tmp_path / "planted")
    os.mkdir(planted)
    os.chmod(planted, 0o1777)
    os.chown(planted, 65534, 65534)  # nobody's
    with pytest.raises(remote.ForeignFolder, match=f"belongs to another user .uid 65534.*RNNMON_{kind.upper()}_DIR"):
        remote.local_folder(kind, "s3://bucket/exp1", planted)
    os.symlink(planted, str(tmp_path / "link"))
    with pytest.raises(remote.ForeignFolder, match="is not a folder"):
        remote.local_folder(kind, "s3://bucket/exp1", str(tmp_path / "link"))


@pytest.mark.slow
def test_the_exit_never_waits_on_a_hung_upload_beyond_its_bound(tmp_path):
    """Against an endpoint that accepts connections and never answers, a process used to give no warning and had
    not exited after 9 min 20 s (the issue's probe): the upload thread's last pass is waited for at most
    `RNNMON_UPLOAD_EXIT_WAIT_S` (2 s here), then one warning names what stays in staging."""
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(64)  # the kernel completes each connection; nothing ever reads or answers
        script = textwrap.dedent(f"""
            import logging, os, time
            logging.basicConfig(level=logging.WARNING)
            from rnnmon.storage.uploader import Uploader
            run_dir = {str(tmp_path / "staging" / "rnnmon")!r}
            os.makedirs(run_dir)
            with open(os.path.join(run_dir, "events.out.tfevents.1.host"), "wb") as f:
                f.write(b"events")
            Uploader(run_dir, "s3://bucket/run/rnnmon", interval_s=0.0).start()
            time.sleep(3)  # its first put is on its way: the process exits while that request hangs
        """)
        env = {**os.environ, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{hung.getsockname()[1]}",
               "AWS_ACCESS_KEY_ID": "key", "AWS_SECRET_ACCESS_KEY": "secret", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
               "RNNMON_UPLOAD_EXIT_WAIT_S": "2", "PYTHONPATH": os.pathsep.join([os.path.dirname(TESTS), *sys.path])}
        begin = time.monotonic()
        result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
        took = time.monotonic() - begin
    assert result.returncode == 0, result.stderr[-2000:]
    assert took < 20, took  # 3 s, the bound (2 s), the imports and slack for a loaded machine; a request's deadline
    # is 20 s, and it hung for good in the probe
    assert "1 file(s) were not uploaded to s3://bucket/run/rnnmon within 2 s of the exit (a request or a read hangs)" \
        in result.stderr, result.stderr[-2000:]


@pytest.mark.slow
def test_a_put_to_an_endpoint_that_never_answers_is_given_up_at_its_deadline(tmp_path, monkeypatch, caplog):
    """A put to such an endpoint outlasted its 20 s request deadline for good (9 min 20 s in the issue's probe,
    over 200 s here): the upload thread made no other pass for the rest of the fit. Each call now has an overall
    deadline (`RNNMON_REQUEST_DEADLINE_S`, 3 s here): the pass fails with one warning and is retried."""
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(64)
        for name, value in {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{hung.getsockname()[1]}",
                            "AWS_ACCESS_KEY_ID": "key", "AWS_SECRET_ACCESS_KEY": "secret",
                            "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": os.devnull,
                            "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "RNNMON_REQUEST_DEADLINE_S": "3"}.items():
            monkeypatch.setenv(name, value)
        run_dir = tmp_path / "staging" / "rnnmon"
        run_dir.mkdir(parents=True)
        (run_dir / "events.out.tfevents.1.host").write_bytes(b"events")
        up = uploader.Uploader(str(run_dir), "s3://bucket/run/rnnmon", interval_s=0.0)
        result = []
        begin = time.monotonic()
        thread = threading.Thread(target=lambda: result.append(up._pass(final=False)), daemon=True)
        thread.start()
        thread.join(60)
        assert result == [False], "the pass still hangs"
        assert time.monotonic() - begin < 20
        (warning,) = [r.getMessage() for r in caplog.records if "cannot upload" in r.getMessage()]
        assert "FSTimeoutError" in warning, warning
