"""A real one-node SLURM cluster on this machine, for the tests (``tests/test_slurm.py``).

Debian's ``slurm-wlm`` and ``munge`` (installed by ``make install`` where the set-up runs as root, see
docs/development.md). ``SlurmCluster`` writes a ``slurm.conf`` of its own under a temporary folder (loopback,
free ports, its own state, spool, pid and log files, its own munge key and socket), starts ``munged``,
``slurmctld`` and ``slurmd``, and stops them (and every job left) in ``stop``, also when a test fails. The node
declares 4 CPUs on this 2-core machine (``SlurmdParameters=config_overrides``) so that two 2-task jobs run at once.
"""
from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

NODE = "localhost"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def missing() -> list[str]:
    """The programs a cluster needs that this machine lacks."""
    return [p for p in ("munged", "slurmctld", "slurmd", "sbatch", "scontrol") if shutil.which(p) is None
            and not Path("/usr/sbin", p).exists()]


class SlurmCluster:
    """``root``: a new folder of its own in the system's temporary folder (pytest's are private to root, and
    munged runs as the ``munge`` user, which must reach its socket and key there); removed by ``stop``."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="scalevec-slurm-"))
        os.chmod(self.root, 0o755)
        self.conf = self.root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._pids: list[Path] = []

    # -- start and stop ----------------------------------------------------------------------------------
    def start(self) -> "SlurmCluster":
        absent = missing()
        if absent:
            raise RuntimeError(f"SLURM is not installed here (no {', '.join(absent)}): `make install` installs "
                               "slurm-wlm and munge as root; see docs/development.md")
        munge = self.root / "munge"
        for d in ("state", "spool", "log"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        munge.mkdir(parents=True, exist_ok=True)
        (munge / "munge.key").write_bytes(os.urandom(1024))
        user = pwd.getpwnam("munge")
        for p in (munge, munge / "munge.key"):
            os.chown(p, user.pw_uid, user.pw_gid)
        os.chmod(munge / "munge.key", 0o400)
        os.chmod(munge, 0o711)
        sock = munge / "sock"
        self._run(["runuser", "-u", "munge", "--", "/usr/sbin/munged", "--force", f"--socket={sock}",
                   f"--key-file={munge / 'munge.key'}", f"--pid-file={munge / 'pid'}", f"--log-file={munge / 'log'}",
                   f"--seed-file={munge / 'seed'}"])
        self._pids.append(munge / "pid")
        r = self.root
        self.conf.write_text("\n".join([
            "ClusterName=scalevec-test", f"SlurmctldHost={NODE}(127.0.0.1)", "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", f"AuthInfo=socket={sock}", "CredType=cred/munge",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU", "JobRequeue=1", "MpiDefault=none", "SlurmdParameters=config_overrides",
            f"SlurmctldPort={free_port()}", f"SlurmdPort={free_port()}", f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}", f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'slurmd.pid'}", f"SlurmctldLogFile={r / 'log/slurmctld.log'}",
            f"SlurmdLogFile={r / 'log/slurmd.log'}", "ReturnToService=2", "MinJobAge=3600", "KillWait=30",
            f"NodeName={NODE} NodeAddr=127.0.0.1 CPUs=4 RealMemory=4000 State=UNKNOWN",
            f"PartitionName=test Nodes={NODE} Default=YES MaxTime=INFINITE State=UP", ""]))
        self._run(["/usr/sbin/slurmctld", "-c", "-f", str(self.conf)])
        self._pids.append(r / "slurmctld.pid")
        self._run(["/usr/sbin/slurmd", "-f", str(self.conf), "-N", NODE])
        self._pids.append(r / "slurmd.pid")
        deadline = time.time() + 60
        while time.time() < deadline:
            out = subprocess.run(["sinfo", "-h", "-o", "%t"], env=self.env, capture_output=True, text=True).stdout
            if out.strip() == "idle":
                return self
            time.sleep(0.5)
        raise RuntimeError(f"the test cluster's node did not come up: {self.logs()}")

    def stop(self) -> None:
        subprocess.run(["scancel", "--full", "--user=root"], env=self.env, capture_output=True)
        deadline = time.time() + 40
        while time.time() < deadline and self.squeue():
            time.sleep(0.5)
        for pidfile in reversed(self._pids):  # slurmd, slurmctld, munged
            try:
                pid = int(pidfile.read_text().split()[0])
                os.kill(pid, signal.SIGTERM)
            except (OSError, ValueError, IndexError):
                continue
            for _ in range(100):
                try:
                    os.kill(pid, 0)
                except OSError:
                    break
                time.sleep(0.1)
            else:
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)

    def _run(self, cmd: list[str]) -> None:
        res = subprocess.run(cmd, env=self.env, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {res.returncode}: {res.stderr.strip()}")

    # -- jobs ----------------------------------------------------------------------------------------------
    def sbatch(self, args: list[str], cwd: Path, env: dict | None = None) -> int:
        res = subprocess.run(["sbatch", "--parsable", *args], cwd=cwd, env={**self.env, **(env or {})},
                             capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"sbatch {' '.join(args)}: {res.stderr.strip()}")
        return int(res.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, Restarts, ExitCode, ...)."""
        out = subprocess.run(["scontrol", "-o", "show", "job", str(job_id)], env=self.env, capture_output=True,
                             text=True).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def squeue(self) -> list[str]:
        return subprocess.run(["squeue", "-h", "-o", "%i"], env=self.env, capture_output=True, text=True).stdout.split()

    def scontrol(self, *args: str) -> None:
        self._run(["scontrol", *args])

    def wait(self, job_id: int, states: tuple[str, ...], timeout: float, restarts: int | None = None) -> dict:
        """Poll until the job is in one of ``states`` (with ``restarts`` restarts, where given)."""
        deadline = time.time() + timeout
        while True:
            info = self.job(job_id)
            if info.get("JobState") in states and (restarts is None or info.get("Restarts") == str(restarts)):
                return info
            if time.time() > deadline:
                raise AssertionError(f"job {job_id} not in {states} after {timeout} s: {info}\n{self.logs()}")
            time.sleep(0.3)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:])
                         for p in sorted((self.root / "log").glob("*.log")))
