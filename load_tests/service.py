"""Start and stop a real ``bentoml serve`` of FastInfer on a free loopback port (benchmarks, tests)."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
# A token of its own in each server started here: every process of it inherits it, even a worker spawned as the
# server stops, which no list of its children taken before can name.
SERVER_MARK = "FASTINFER_STARTED_AS"


@dataclass
class Server:
    url: str
    process: subprocess.Popen
    log: Path
    mark: str = ""

    def processes(self) -> list[psutil.Process]:
        """Every live process of this server, its supervisor's children or not."""
        found = []
        for process in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if self.mark and process.environ().get(SERVER_MARK) == self.mark:
                    found.append(process)
        return found

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    home: Path | None,
    log: Path,
    env: dict[str, str] | None = None,
    timeout: float = 240,
    target: str = "service:FastInfer",
    cwd: Path = ROOT,
    ready: Callable[[str], bool] | None = None,
) -> Server:
    """``bentoml serve TARGET`` (the source tree by default, or a built bento's tag); returns when ready:
    its /readyz answers 200, or ``ready(url)`` says so (a server whose model is broken is never ready)."""
    ready = ready or (lambda url: httpx.get(f"{url}/readyz", timeout=2).status_code == 200)
    port = free_port()
    # Keys exported in the shell for a real deploy do not lock the servers started here (unless ``env`` says).
    shell = {k: v for k, v in os.environ.items() if k not in ("FASTINFER_API_KEYS", "FASTINFER_API_KEYS_FILE")}
    mark = secrets.token_hex(8)
    full_env = {**shell, **({"BENTOML_HOME": str(home)} if home else {}), **(env or {}), SERVER_MARK: mark}
    bentoml_cli = Path(sys.executable).parent / "bentoml"
    log.parent.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [str(bentoml_cli), "serve", target, "--host", "127.0.0.1", "--port", str(port)],
        cwd=cwd,
        env=full_env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # so that stopping it stops its runner processes too
    )
    server = Server(f"http://127.0.0.1:{port}", process, log, mark)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"bentoml serve exited with {process.returncode}:\n{server.log_tail()}")
            try:
                if ready(server.url):
                    return server
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
    except BaseException:  # a broken check, or Ctrl-C while it starts, must not leave a server running unowned
        stop_server(server)
        raise
    stop_server(server)
    raise RuntimeError(f"bentoml serve not ready after {timeout}s:\n{server.log_tail()}")


def stop_server(server: Server, timeout_s: float = 30) -> None:
    """Stop the server and every process of it: its workers may outlive the supervisor for a moment
    (runners drain after it, runners/drain.py), and while one lives its pins hold (fastinfer.catalog.store)."""
    if server.process.poll() is None:
        os.killpg(server.process.pid, signal.SIGTERM)
        try:
            server.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait()
    _, left = psutil.wait_procs(server.processes(), timeout=timeout_s)  # runners drain after the supervisor
    for process in left + server.processes():  # not in its process group, deaf to SIGTERM, or spawned late
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(server.processes(), timeout=10)  # gone, its locks with it, before the caller goes on
