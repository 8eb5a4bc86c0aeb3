"""A real `redis-server` for the tests: started on 127.0.0.1 at a free port, persistence off, its
files in a temporary directory, stopped at the end. Plain TCP, or TLS only (a throwaway CA and
server certificate made with `openssl`)."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import time
import uuid
from pathlib import Path

BINARY = shutil.which("redis-server")
NO_SERVER = "redis-server is not installed (apt-get install redis-server)"


def server_version() -> str:
    """The installed redis-server's version ("7.0.15")."""
    out = subprocess.run([BINARY, "--version"], check=False, capture_output=True, text=True).stdout
    return next((w[2:] for w in out.split() if w.startswith("v=")), out.strip())


def unique_prefix() -> str:
    """A cache prefix no other test uses: each test's cache is its own on a shared server."""
    return "t" + uuid.uuid4().hex[:12]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """One redis-server process; `url(prefix)` names a cache on it."""

    def __init__(self, workdir: Path, *args: str, tls: TlsFiles | None = None) -> None:
        self.dir, self.args, self.tls = Path(workdir), list(args), tls
        self.dir.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def start(self) -> RedisServer:
        for _ in range(5):  # a free port can be taken between the probe and the bind: try another
            self.port = free_port()
            ports = ["--port", "0", "--tls-port", str(self.port), *self.tls.server_args()] if self.tls \
                else ["--port", str(self.port)]
            log = open(self.dir / f"redis-{self.port}.log", "w")
            self.proc = subprocess.Popen([BINARY, *ports, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                          "--dir", str(self.dir), *self.args], stdout=log, stderr=subprocess.STDOUT)
            log.close()
            if self._wait():
                return self
            self.stop()
        raise RuntimeError(f"redis-server did not start: {self.log()[-500:]}")

    def _wait(self, timeout: float = 10.0) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                return False
            try:
                if self._ping():
                    return True
            except OSError:
                pass
            time.sleep(0.02)
        return False

    def _ping(self) -> bool:
        """A reply to PING (+PONG, or -NOAUTH behind a password) means the server is up."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=1) as raw:
            s = self.tls.client_context().wrap_socket(raw, server_hostname="localhost") if self.tls else raw
            s.sendall(b"PING\r\n")
            return s.recv(64)[:1] in (b"+", b"-")

    def log(self) -> str:
        p = self.dir / f"redis-{self.port}.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def url(self, prefix: str = "srt", auth: str = "", db: int = 0, query: str = "") -> str:
        scheme = "rediss" if self.tls else "redis"
        q = f"?prefix={prefix}" + (f"&{query}" if query else "")
        return f"{scheme}://{auth + '@' if auth else ''}127.0.0.1:{self.port}/{db}{q}"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class TlsFiles:
    """A throwaway CA and a server certificate for localhost/127.0.0.1, made by `openssl`."""

    def __init__(self, d: Path) -> None:
        self.dir = Path(d)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ca, self.ca_key = self.dir / "ca.crt", self.dir / "ca.key"
        self.cert, self.key = self.dir / "server.crt", self.dir / "server.key"
        run = lambda *a: subprocess.run(["openssl", *a], check=True, capture_output=True, cwd=self.dir)  # noqa: E731
        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=srt test CA",
            "-keyout", str(self.ca_key), "-out", str(self.ca))
        (self.dir / "san.cnf").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
        run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-keyout", str(self.key),
            "-out", str(self.dir / "server.csr"))
        run("x509", "-req", "-in", str(self.dir / "server.csr"), "-CA", str(self.ca), "-CAkey", str(self.ca_key),
            "-CAcreateserial", "-days", "1", "-extfile", str(self.dir / "san.cnf"), "-out", str(self.cert))

    def server_args(self) -> list[str]:
        return ["--tls-cert-file", str(self.cert), "--tls-key-file", str(self.key),
                "--tls-ca-cert-file", str(self.ca), "--tls-auth-clients", "no"]

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))


def start_tls(workdir: Path) -> RedisServer | str:
    """A TLS-only server, or why there is none here (no openssl, or a redis-server built
    without TLS: it refuses the TLS options at start)."""
    if shutil.which("openssl") is None:
        return "openssl is not installed"
    server = RedisServer(workdir / "server", tls=TlsFiles(workdir / "tls"))
    try:
        return server.start()
    except RuntimeError:
        lines = [x for x in server.log().splitlines() if "tls" in x.lower()]
        return "this redis-server cannot serve TLS: " + (lines[-1].strip() if lines else server.log()[-200:].strip())
