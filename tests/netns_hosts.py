"""Two "hosts" on one machine for the tests: two network namespaces of their own, joined by a veth pair.

``two_hosts()`` makes them (root and ``ip`` needed; ``skip_reason()`` says why not): namespaces named with this
process's id and a counter, a veth pair with one end in each, a ``/30`` of ``10.x.y.z`` made from the same two
numbers, ``lo`` up in both. The addresses exist only inside those namespaces: nothing is routed to or from the
machine's own namespace, so the test process itself cannot reach them and runs every command through
``Host.popen`` / ``Host.run`` (``ip netns exec NS unshare --uts``, with the host's own hostname). Each host's
``/etc/hosts`` (``ip netns exec`` bind-mounts ``/etc/netns/NS/hosts``) names both hosts by their addresses, as a
cluster's resolver does: torchrun's rendezvous hands out rank 0's hostname and gloo binds to the address its own
hostname resolves to. On leaving (also on an error or a failed assertion) every process in both namespaces is
killed (``ip netns pids``), the namespaces (and the veth pair with them) and ``/etc/netns/NS`` are deleted.

Faults: ``cut()`` sets the host's end of the link down inside its namespace (alive, but "Network is unreachable"),
``kill()`` SIGKILLs every process of the host (but the ones it is told to keep, e.g. the S3 server).

``S3InHost`` runs moto's server (``tests/s3_server.py``) inside the first host on its address, so both hosts
reach it, makes its user and the prepared test corpus in ``s3://corpus/shakespeare`` from inside that host
(``python tests/netns_hosts.py s3-setup ENDPOINT``).
"""
from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
_count = itertools.count()


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def skip_reason() -> Optional[str]:
    """Why namespaces cannot be made here (not root, no ``ip``, no ``unshare``), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"no '{tool}' command"
    name = f"svprobe{os.getpid()}"
    made = _ip("netns", "add", name, check=False)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return None


@dataclass
class Host:
    ns: str  # the network namespace
    hostname: str  # its own hostname (a UTS namespace per command), resolved by both hosts' /etc/hosts
    addr: str  # its address, only inside the namespaces
    veth: str  # its end of the link
    procs: list = field(default_factory=list)

    def command(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns, "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"',
                self.hostname, *argv]

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        proc = subprocess.Popen(self.command(argv), **kwargs)
        self.procs.append(proc)
        return proc

    def run(self, argv: list[str], timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(argv), timeout=timeout, **kwargs)

    def pids(self) -> list[int]:
        out = _ip("netns", "pids", self.ns, check=False).stdout
        return [int(p) for p in out.split()]

    def cut(self) -> None:
        """The host's link down, from inside: alive, but nothing reaches it and it reaches nothing."""
        _ip("-n", self.ns, "link", "set", self.veth, "down")

    def restore(self) -> None:
        _ip("-n", self.ns, "link", "set", self.veth, "up")

    def kill(self, keep: tuple[int, ...] = ()) -> list[int]:
        """SIGKILL every process in this host's namespace but ``keep`` (and their parents' ``ip netns exec``)."""
        killed = []
        for pid in self.pids():
            if pid in keep:
                continue
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        return killed

    def reap(self) -> None:
        for proc in self.procs:
            with suppress(Exception):
                proc.wait(10)


@dataclass
class TwoHosts:
    a: Host
    b: Host

    @property
    def hosts(self) -> tuple[Host, Host]:
        return self.a, self.b


def _addresses(n: int) -> tuple[str, str]:
    """A /30 of 10.x.y.z from this process's id and a counter: two runs side by side differ."""
    pid = os.getpid()
    second, third, block = 64 + pid % 128, (pid // 128) % 256, (n * 4 + 4) % 256
    return f"10.{second}.{third}.{block + 1}", f"10.{second}.{third}.{block + 2}"


@contextmanager
def two_hosts() -> Iterator[TwoHosts]:
    n = next(_count)
    tag = f"{os.getpid()}x{n}"
    addr_a, addr_b = _addresses(n)
    a = Host(f"svA{tag}", f"sv-hosta-{tag}", addr_a, f"sva{tag}"[:15])
    b = Host(f"svB{tag}", f"sv-hostb-{tag}", addr_b, f"svb{tag}"[:15])
    made: list[Host] = []
    try:
        hosts_file = f"127.0.0.1 localhost\n{a.addr} {a.hostname}\n{b.addr} {b.hostname}\n"
        for host in (a, b):
            _ip("netns", "add", host.ns)
            made.append(host)
            etc = Path("/etc/netns") / host.ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts_file)
        _ip("link", "add", a.veth, "type", "veth", "peer", "name", b.veth)
        for host in (a, b):
            _ip("link", "set", host.veth, "netns", host.ns)
            _ip("-n", host.ns, "addr", "add", f"{host.addr}/30", "dev", host.veth)
            _ip("-n", host.ns, "link", "set", host.veth, "up")
            _ip("-n", host.ns, "link", "set", "lo", "up")
        yield TwoHosts(a, b)
    finally:
        for _ in range(3):  # a process may start another while the first are killed
            for host in made:
                host.kill()
            time.sleep(0.2)
        for host in made:
            host.reap()
            _ip("netns", "del", host.ns, check=False)
            shutil.rmtree(Path("/etc/netns") / host.ns, ignore_errors=True)
        with suppress(Exception):  # a veth left in the machine's namespace by a failed move
            _ip("link", "del", a.veth, check=False)


class S3InHost:
    """moto's server inside ``host`` on its address: ``endpoint``, ``env`` (the standard AWS variables) and ``url``
    (the prepared corpus, ``s3://corpus/shakespeare``)."""

    def __init__(self, host: Host, port: int = 9000) -> None:
        self.host, self.port = host, port
        self.endpoint = f"http://{host.addr}:{port}"
        self.url = "s3://corpus/shakespeare"
        self.env: dict[str, str] = {}
        self.proc: Optional[subprocess.Popen] = None

    def start(self, cwd: Path) -> "S3InHost":
        from s3_server import _SETUP_REQUESTS, _executable

        env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(_SETUP_REQUESTS)}
        self.proc = self.host.popen([_executable(), "-H", self.host.addr, "-p", str(self.port)], env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        setup = self.host.run([sys.executable, str(Path(__file__).resolve()), "s3-setup", self.endpoint], cwd=cwd,
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{HERE}", "OMP_NUM_THREADS": "1"})
        if setup.returncode != 0:
            raise RuntimeError(f"S3 setup inside {self.host.ns} failed: {setup.stdout[-2000:]}{setup.stderr[-3000:]}")
        keys = json.loads(setup.stdout.strip().splitlines()[-1])
        self.env = {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": keys["id"],
                    "AWS_SECRET_ACCESS_KEY": keys["secret"], "AWS_DEFAULT_REGION": "us-east-1"}
        return self

    def pids(self) -> tuple[int, ...]:
        """The server's processes (``ip netns exec``, ``unshare`` and ``sh`` exec into it: one pid)."""
        return (self.proc.pid,) if self.proc is not None else ()


def _s3_setup(endpoint: str) -> None:
    """Inside the first host: wait for the server, make its user and bucket, prepare the corpus into it."""
    import socket
    from urllib.parse import urlparse

    from s3_server import BUCKET, CHUNK_TOKENS, PREFIX, S3Server

    where = urlparse(endpoint)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection((where.hostname, where.port), 0.2).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    server = S3Server(where.port)
    server.endpoint = endpoint
    server._make_user()
    server.client().create_bucket(Bucket=BUCKET)
    os.environ.update(server.env)
    from scalevec_lit.data.prepare import main

    with suppress(SystemExit):
        main(["--output", f"s3://{BUCKET}/{PREFIX}", "--chunk-tokens", str(CHUNK_TOKENS), "--num-workers", "1"])
    print(json.dumps({"id": server.key_id, "secret": server.secret}))


if __name__ == "__main__":
    if sys.argv[1:2] == ["s3-setup"]:
        _s3_setup(sys.argv[2])
