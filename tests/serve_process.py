"""The real `localspec serve` command in a child process, on a free loopback port (`--port 0`).

The port is read from uvicorn's start-up line, so no port is guessed and none can be taken in
between. Stopped with SIGTERM (uvicorn's graceful shutdown), then SIGKILL if it does not exit.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence

from tests.server_harness import request

_LISTENING = re.compile(r"Uvicorn running on https?://127\.0\.0\.1:(\d+)")


class ServeProcess:
    def __init__(self, args: Sequence[str], env: Mapping[str, str] | None = None, ready_timeout: float = 300,
                 tls: bool = False) -> None:
        self.tls = tls  # the server speaks HTTPS: readiness is checked over TLS, without verifying the test certificate
        self.argv = [sys.executable, "-m", "localspec", "serve", "--host", "127.0.0.1", "--port", "0", *args]
        self.env = dict(os.environ if env is None else env)
        self.ready_timeout = ready_timeout
        self.lines: list[str] = []
        self.port: int | None = None
        self._proc: subprocess.Popen[str] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return "\n".join(self.lines[-40:])

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def _wait_for(self, what: str, ready) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while not ready():
            if self._proc.poll() is not None:
                code = self._proc.returncode
                raise RuntimeError(f"`localspec serve` exited ({code}) before {what}:\n{self.output()}")
            if time.monotonic() > deadline:
                waited = f"{self.ready_timeout:.0f} s"
                raise RuntimeError(f"`localspec serve` did not reach {what} in {waited}:\n{self.output()}")
            time.sleep(0.05)

    def _port_from_log(self) -> bool:
        for line in self.lines:
            if m := _LISTENING.search(line):
                self.port = int(m.group(1))
                return True
        return False

    def _healthy(self) -> bool:
        if self.tls:
            import http.client
            import ssl

            conn = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=10,
                                               context=ssl._create_unverified_context())
            try:
                conn.request("GET", "/health")
                return conn.getresponse().status == 200
            except OSError:
                return False
            finally:
                conn.close()
        try:
            return request(self.base_url, "GET", "/health", timeout=10).status_code == 200
        except OSError:
            return False

    def __enter__(self) -> ServeProcess:
        self._proc = subprocess.Popen(self.argv, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, text=True, bufsize=1)
        threading.Thread(target=self._read, name="serve-output", daemon=True).start()
        try:
            self._wait_for("listening", self._port_from_log)
            self._wait_for("GET /health = 200", self._healthy)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self._proc is None or self._proc.poll() is not None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=30)

    def __exit__(self, *exc: object) -> None:
        self.stop()
