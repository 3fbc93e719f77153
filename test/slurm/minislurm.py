"""A single-node Slurm cluster in a temporary folder, for tests (root only).

MiniSlurm(root).start() writes <root>/etc/slurm.conf (its own ports, state, spool and log
folders; proctrack/linuxproc and task/none so no cgroups are needed; SlurmUser=root),
starts munged (as user munge, unless one already answers), slurmctld and slurmd, and waits
until the node is idle. Commands run with `env()` (SLURM_CONF) talk to it. stop() ends
every daemon it started, by pid, and is safe to call twice; use it in a `finally` or as a
context manager.
"""
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time

DAEMONS = ("slurmd", "slurmctld", "munged")  # the order stop() ends them in


def installed():
    """The Slurm and MUNGE programs, or a list of the missing ones."""
    need = {"slurmctld": "/usr/sbin", "slurmd": "/usr/sbin", "munged": "/usr/sbin",
            "sbatch": "/usr/bin", "scontrol": "/usr/bin", "srun": "/usr/bin", "munge": "/usr/bin"}
    return [p for p, d in need.items() if not (shutil.which(p) or os.path.exists(f"{d}/{p}"))]


def _which(p):
    return shutil.which(p) or next(f"{d}/{p}" for d in ("/usr/sbin", "/usr/bin")
                                   if os.path.exists(f"{d}/{p}"))


def alive(pid):
    """Whether pid runs (a zombie, which an init that does not reap leaves, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _free_ports(n):
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


class MiniSlurm:
    def __init__(self, root, cpus=2, cred_expire=10, extra_conf=""):
        self.root = os.path.abspath(root)
        self.cpus = cpus
        self.cred_expire = cred_expire
        self.extra_conf = extra_conf
        self.host = socket.gethostname().split(".")[0]
        self.conf = os.path.join(self.root, "etc", "slurm.conf")
        self.procs = {}      # name -> pid of the daemons this object started
        self.started_at = None  # time.time() just before slurmctld started
        self.log = os.path.join(self.root, "log")

    # ---- environment -----------------------------------------------------------------
    def env(self, **extra):
        e = dict(os.environ)
        e["SLURM_CONF"] = self.conf
        for k in [k for k in e if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))]:
            if k != "SLURM_CONF":
                del e[k]
        e.update(extra)
        return e

    def run(self, *args, check=True, timeout=60, **kw):
        p = subprocess.run(list(args), env=kw.pop("env", None) or self.env(), capture_output=True,
                           text=True, timeout=timeout, **kw)
        if check and p.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} exited {p.returncode}: {p.stderr.strip()}")
        return p

    # ---- daemons -----------------------------------------------------------------------
    def _munge_works(self):
        try:
            cred = subprocess.run(["munge", "-n"], capture_output=True, timeout=10)
            if cred.returncode != 0:
                return False
            return subprocess.run(["unmunge"], input=cred.stdout, capture_output=True,
                                  timeout=10).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def _start_munged(self):
        if self._munge_works():
            return
        mu = pwd.getpwnam("munge")
        for d in ("/run/munge", "/var/log/munge", "/var/lib/munge", "/etc/munge"):
            os.makedirs(d, exist_ok=True)
            os.chown(d, mu.pw_uid, mu.pw_gid)
        os.chmod("/run/munge", 0o755)
        key = "/etc/munge/munge.key"
        if not os.path.exists(key):
            with open(key, "wb") as f:
                f.write(os.urandom(128))
        os.chown(key, mu.pw_uid, mu.pw_gid)
        os.chmod(key, 0o600)
        pidfile = "/run/munge/munged.pid"
        if os.path.exists(pidfile):
            os.remove(pidfile)
        # munged daemonizes; run it as munge and read its pid back from the pid file.
        subprocess.run(["runuser", "-u", "munge", "--", _which("munged"), "--force"],
                       check=True, timeout=30)
        for _ in range(100):
            if os.path.exists(pidfile) and self._munge_works():
                break
            time.sleep(0.1)
        with open(pidfile) as f:
            self.procs["munged"] = int(f.read().strip())
        if not self._munge_works():
            raise RuntimeError("munged started but munge -n | unmunge fails")

    def write_conf(self):
        for d in ("etc", "state", "spool", "log", "run"):
            os.makedirs(os.path.join(self.root, d), exist_ok=True)
        ctld_port, d_port = _free_ports(2)
        r = self.root
        conf = f"""# written by test/slurm/minislurm.py
ClusterName=trident-test
MailProg=/bin/true
SlurmctldHost={self.host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire={self.cred_expire}
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/slurmd-%n
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdPidFile={r}/run/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
# The node may declare more CPUs than the machine has (tests run paced jobs side by side).
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
MinJobAge=600
KillWait=10
InactiveLimit=0
Waittime=0
JobRequeue=1
NodeName={self.host} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN
PartitionName=debug Nodes={self.host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
{self.extra_conf}
"""
        with open(self.conf, "w") as f:
            f.write(conf)

    def _start(self, name, *args):
        exe = _which(name)
        subprocess.run([exe, "-f", self.conf, *args], check=True, timeout=60, env=self.env())
        pidfile = os.path.join(self.root, "run", f"{name}.pid")
        for _ in range(100):
            if os.path.exists(pidfile) and os.path.getsize(pidfile):
                break
            time.sleep(0.1)
        with open(pidfile) as f:
            self.procs[name] = int(f.read().strip())

    def start(self, timeout=60):
        try:
            self.write_conf()
            self._start_munged()
            self.started_at = time.time()
            self._start("slurmctld")
            self._start("slurmd")
            t0 = time.time()
            while time.time() - t0 < timeout:
                p = self.run("sinfo", "-h", "-N", "-o", "%T", check=False)
                if p.returncode == 0 and p.stdout.strip() in ("idle", "idle*") \
                        and "*" not in p.stdout:
                    return self
                time.sleep(0.5)
            raise RuntimeError(f"the node did not become idle in {timeout} s: "
                               f"{self.run('sinfo', '-N', check=False).stdout}")
        except BaseException:
            self.dump_logs()
            self.stop()
            raise

    def cancel_all(self, timeout=30):
        """Cancels every job of this cluster and waits until none is left running."""
        if "slurmctld" not in self.procs:
            return
        p = self.run("squeue", "-h", "-o", "%i", check=False)
        ids = p.stdout.split() if p.returncode == 0 else []
        if ids:
            self.run("scancel", *ids, check=False)
        t0 = time.time()
        while ids and time.time() - t0 < timeout:
            p = self.run("squeue", "-h", "-o", "%i", check=False)
            if p.returncode != 0 or not p.stdout.split():
                break
            time.sleep(0.5)

    def stop(self):
        """Cancels the jobs, then ends slurmd, slurmctld and (if it started it) munged."""
        try:
            self.cancel_all()
        except (OSError, subprocess.SubprocessError):
            pass
        for name in DAEMONS:
            pid = self.procs.pop(name, None)
            if pid is None:
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            for _ in range(100):
                if not alive(pid):
                    break
                time.sleep(0.1)
            else:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def dump_logs(self, lines=40):
        for name in ("slurmctld.log", "slurmd.log"):
            path = os.path.join(self.log, name)
            if os.path.exists(path):
                with open(path) as f:
                    tail = f.readlines()[-lines:]
                print(f"---- {path} (last {len(tail)} lines)")
                print("".join(tail), end="")

    # ---- jobs ------------------------------------------------------------------------
    def job(self, jobid):
        """`scontrol show job` as a dict (empty when the controller forgot it)."""
        p = self.run("scontrol", "-o", "show", "job", str(jobid), check=False)
        if p.returncode != 0:
            return {}
        out = {}
        for tok in p.stdout.split():
            if "=" in tok:
                k, v = tok.split("=", 1)
                out.setdefault(k, v)
        return out

    def wait_job(self, jobid, timeout, states=("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
                                               "NODE_FAIL", "OUT_OF_MEMORY", "DEADLINE",
                                               "PREEMPTED", "BOOT_FAIL")):
        t0 = time.time()
        while time.time() - t0 < timeout:
            st = self.job(jobid).get("JobState", "")
            if st in states:
                return st
            time.sleep(0.5)
        raise TimeoutError(f"job {jobid} still {self.job(jobid).get('JobState')} after {timeout} s")
