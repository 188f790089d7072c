"""Debian's nginx in front of a gateway, as an unprivileged process on a loopback port, with its
own prefix and configuration in a temporary directory (no system service, no system paths).

The site configuration is ``deploy/nginx.conf``, the file docs/deployment.md shows, with only its
addresses and paths replaced; the main configuration around it is what a Debian install puts in
``/etc/nginx/nginx.conf``, cut to what this needs, with every path inside the prefix.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SITE = REPO / "deploy" / "nginx.conf"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
STARTUP_TIMEOUT_S = 10.0

MAIN = """\
daemon off;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log info;
events {{ worker_connections 128; }}
http {{
    access_log {prefix}/access.log;
    client_body_temp_path {prefix}/tmp/body;
    proxy_temp_path {prefix}/tmp/proxy;
    fastcgi_temp_path {prefix}/tmp/fastcgi;
    uwsgi_temp_path {prefix}/tmp/uwsgi;
    scgi_temp_path {prefix}/tmp/scgi;
    # The upstream connections leave from another loopback address than the client's, so a test
    # can tell the proxy (what the gateway's socket sees) from the client (X-Forwarded-For).
    proxy_bind {proxy_address};
    include {prefix}/voicewire.conf;
}}
"""


@dataclass(frozen=True)
class Nginx:
    url: str  # https://127.0.0.1:PORT
    origin: str  # the browser's Origin for pages it serves (the same as url)
    prefix: Path


def render_site(listen_port: int, cert: Path, key: Path, upstream: str) -> str:
    """deploy/nginx.conf with its example port, name, certificate and upstream replaced."""
    text = SITE.read_text()
    for old, new in (
        ("listen 443 ssl;", f"listen 127.0.0.1:{listen_port} ssl;"),
        ("server_name voice.example.com;", "server_name 127.0.0.1;"),
        ("/etc/ssl/voice.example.com/fullchain.pem;", f"{cert};"),
        ("/etc/ssl/voice.example.com/privkey.pem;", f"{key};"),
        ("server 127.0.0.1:8080;", f"server {upstream};"),
    ):
        assert text.count(old) == 1, f"deploy/nginx.conf no longer has {old!r} once"
        text = text.replace(old, new)
    return text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def nginx(cert: Path, key: Path, upstream: str, proxy_address: str) -> Iterator[Nginx]:
    """Run nginx in front of ``upstream`` (host:port) until the block ends. As root it runs as
    ``nobody``: a proxy on the internet's edge should not hold root, and a test must not either."""
    prefix = Path(tempfile.mkdtemp(prefix="voicewire-nginx-"))
    port = _free_port()
    (prefix / "tmp").mkdir()
    for name, source in (("cert.pem", cert), ("key.pem", key)):
        shutil.copy(source, prefix / name)
    (prefix / "voicewire.conf").write_text(
        render_site(port, prefix / "cert.pem", prefix / "key.pem", upstream)
    )
    (prefix / "nginx.conf").write_text(MAIN.format(prefix=prefix, proxy_address=proxy_address))
    uid = gid = None
    if os.geteuid() == 0:
        nobody = pwd.getpwnam("nobody")
        uid, gid = nobody.pw_uid, nobody.pw_gid
        for path in [prefix, *prefix.rglob("*")]:
            os.chown(path, uid, gid)
    log = open(prefix / "stderr.log", "wb")  # noqa: SIM115 - closed below, after the process
    proc = subprocess.Popen(
        [NGINX, "-p", str(prefix), "-c", str(prefix / "nginx.conf"), "-e", str(prefix / "error.log")],
        stdout=log,
        stderr=log,
        start_new_session=True,
        user=uid,
        group=gid,
        extra_groups=[] if uid is not None else None,
    )
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"nginx did not start (exit {proc.poll()}): {_logs(prefix)}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            time.sleep(0.05)
        yield Nginx(f"https://127.0.0.1:{port}", f"https://127.0.0.1:{port}", prefix)
    finally:
        proc.terminate()  # SIGTERM: nginx's fast shutdown, workers included
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
        log.close()
        shutil.rmtree(prefix, ignore_errors=True)


def _logs(prefix: Path) -> str:
    return " | ".join(
        (prefix / n).read_text(errors="replace")[-2000:]
        for n in ("stderr.log", "error.log")
        if (prefix / n).exists()
    )
