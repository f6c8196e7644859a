"""Emulated devices on one machine: each device is a network namespace joined to a bridge by
a veth pair, with a `tc tbf` rate on its egress, and a CPU share of its own (a core of its own
when the devices fit the cores, else a cgroup CPU quota: cpu.cfs_quota_us on cgroup v1,
cpu.max on v2). `tc netem` (delay, loss) is not on this kernel, so links have a rate only.

Everything a testbed makes carries its name (lptb<pid>...), and everything is removed when it
closes, on every exit path: the context manager, SIGINT and SIGTERM (turned into exceptions),
and `clean_stale()` for what a killed testbed (SIGKILL) left behind, which the next one runs
first. Needs root (CAP_NET_ADMIN and the cgroup filesystem); refused clearly otherwise."""

import dataclasses
import os
import shutil
import signal
import subprocess
import time
from typing import List, Optional

from experiments.cli import raise_for_signal
from experiments.common import fail, say
from experiments.testbed.report import link_text

PREFIX = "lptb"
SUBNET = "10.213"  # 10.213.<testbed>.<device>/16 inside the testbed's own namespaces only
# One file per live testbed, named by its number (1..250, its subnet byte and its names'),
# holding the owner's pid: a number whose owner is gone is left over from a killed testbed.
REGISTRY = "/run/localpar-testbed"
CGROUP_V1 = "/sys/fs/cgroup/cpu"
CGROUP_V2 = "/sys/fs/cgroup"
PERIOD_US = 100000


def sh(*cmd, check=True):
    out = subprocess.run(list(cmd), capture_output=True, text=True)
    if check and out.returncode != 0:
        fail(f"{' '.join(cmd)}: {out.stderr.strip() or out.stdout.strip()} (exit {out.returncode})")
    return out


def require_root():
    """Refuses, saying why, where namespaces, tc or cgroups cannot be made."""
    if os.geteuid() != 0:
        fail("the testbed needs root: it makes network namespaces, veth pairs, tc qdiscs and "
             "cgroups (run it as root, or with sudo)")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            fail(f"the testbed needs `{tool}` (Debian package iproute2)")
    if not (os.path.isdir(CGROUP_V1) or os.path.exists(os.path.join(CGROUP_V2, "cgroup.controllers"))):
        fail(f"no cgroup CPU controller mounted ({CGROUP_V1}, or cgroup v2 at {CGROUP_V2})")


def cgroup_root():
    """(path, version) of the CPU controller this machine mounts."""
    if os.path.isdir(CGROUP_V1):
        return CGROUP_V1, 1
    return CGROUP_V2, 2


@dataclasses.dataclass
class Device:
    name: str  # "coordinator", "device0", ...
    netns: str
    ip: str
    cpu_fraction: float  # of one core
    cpu: Optional[int]  # the core it is pinned to, when devices fit the cores
    cgroup: Optional[str]


class Testbed:
    """`devices` worker devices and one coordinator device, each egress limited to `link_mbit`
    (0: unshaped), with `worker_cpu` of a core each (None: a core each where they fit, else an
    equal share of what the coordinator leaves) and `coordinator_cpu` for the coordinator."""

    def __init__(self, devices, link_mbit=0.0, worker_cpu=None, coordinator_cpu=0.25,
                 cores=None):
        require_root()
        self.index = 0  # allocated on entry
        self.tag = ""
        self.link_mbit = link_mbit
        self.cores = cores or len(os.sched_getaffinity(0))
        self.switch = ""
        self.devices: List[Device] = []
        self.made_cgroups: List[str] = []
        self.made_netns: List[str] = []
        self.count = devices
        self.coordinator_cpu = coordinator_cpu
        self.worker_cpu = worker_cpu
        self._old_handlers = {}

    # --- the share of CPU each device gets ---------------------------------------------------

    def plan_cpu(self):
        """(fraction per worker, pinned): a core each when the workers and the coordinator
        fit the cores, else quotas that add up to at most every core."""
        n = self.count
        if self.worker_cpu is not None:
            return self.worker_cpu, False
        if n + 1 <= self.cores:
            return 1.0, True
        return min(1.0, (self.cores - self.coordinator_cpu) / n), False

    # --- making and removing -----------------------------------------------------------------

    def __enter__(self):
        clean_stale()
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old_handlers[sig] = signal.signal(sig, raise_for_signal)
        self.index = _claim_number()
        self.tag = f"{PREFIX}{self.index}"
        self.switch = f"{self.tag}-sw"
        try:
            self._make()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _make(self):
        sh("ip", "netns", "add", self.switch)
        self.made_netns.append(self.switch)
        self._in(self.switch, "ip", "link", "set", "lo", "up")
        self._in(self.switch, "ip", "link", "add", "br0", "type", "bridge")
        self._in(self.switch, "ip", "link", "set", "br0", "up")
        fraction, pinned = self.plan_cpu()
        names = ["coordinator"] + [f"device{k}" for k in range(self.count)]
        for i, name in enumerate(names):
            share = self.coordinator_cpu if name == "coordinator" else fraction
            cpu = (i % self.cores) if pinned else None
            self.devices.append(self._device(i, name, share, cpu))
        say(f"testbed {self.tag}: {self.count} devices + the coordinator, links "
            + link_text(self.link_mbit)
            + ", " + (f"a core each (of {self.cores})" if pinned else
                      f"{fraction:.2f} of a core each, the coordinator {self.coordinator_cpu:.2f}"))

    def _in(self, netns, *cmd):
        return sh("ip", "netns", "exec", netns, *cmd)

    def _device(self, i, name, share, cpu):
        netns = f"{self.tag}-{i}"
        sh("ip", "netns", "add", netns)
        self.made_netns.append(netns)
        self._in(netns, "ip", "link", "set", "lo", "up")
        outer, inner = f"{self.tag}s{i}", f"{self.tag}d{i}"  # at most 15 characters
        sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
        sh("ip", "link", "set", outer, "netns", self.switch)
        sh("ip", "link", "set", inner, "netns", netns)
        self._in(self.switch, "ip", "link", "set", outer, "master", "br0")
        self._in(self.switch, "ip", "link", "set", outer, "up")
        ip = f"{SUBNET}.{self.index}.{i + 1}"
        self._in(netns, "ip", "link", "set", inner, "name", "eth0")
        self._in(netns, "ip", "addr", "add", f"{ip}/16", "dev", "eth0")
        self._in(netns, "ip", "link", "set", "eth0", "up")
        if self.link_mbit > 0:
            # A token bucket on the device's egress: its rate, a burst of 32 KiB (about a
            # millisecond at 250 Mbit/s), and at most 100 ms of queue before drops.
            self._in(netns, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate",
                     f"{self.link_mbit:g}mbit", "burst", "32kb", "latency", "100ms")
        group = self._cgroup(name, share) if cpu is None else None
        return Device(name, netns, ip, share, cpu, group)

    def _cgroup(self, name, share):
        root, version = cgroup_root()
        path = os.path.join(root, f"{self.tag}-{name}")
        os.makedirs(path, exist_ok=True)
        self.made_cgroups.append(path)
        quota = max(1000, int(share * PERIOD_US))
        if version == 1:
            with open(os.path.join(path, "cpu.cfs_period_us"), "w") as f:
                f.write(str(PERIOD_US))
            with open(os.path.join(path, "cpu.cfs_quota_us"), "w") as f:
                f.write(str(quota))
        else:
            with open(os.path.join(path, "cpu.max"), "w") as f:
                f.write(f"{quota} {PERIOD_US}")
        return path

    def close(self):
        """Removes every namespace (their veths and qdiscs with them) and cgroup it made."""
        for netns in reversed(self.made_netns):
            _kill_netns_processes(netns)
            sh("ip", "netns", "del", netns, check=False)
        self.made_netns.clear()
        for path in reversed(self.made_cgroups):
            _remove_cgroup(path)
        self.made_cgroups.clear()
        if self.index:
            _release_number(self.index)
            self.index = 0
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self._old_handlers.clear()

    # --- running on a device -----------------------------------------------------------------

    def device(self, name):
        return next(d for d in self.devices if d.name == name)

    def command(self, device, argv):
        """argv run on `device`: in its namespace, on its core or in its cgroup (the shell
        joins the cgroup before it execs, so nothing runs outside it)."""
        inner = ["ip", "netns", "exec", device.netns]
        if device.cpu is not None:
            inner += ["taskset", "-c", str(device.cpu)]
        inner += list(argv)
        if device.cgroup is None:
            return inner
        join = f"echo $$ > {device.cgroup}/cgroup.procs && exec \"$@\""
        return ["sh", "-c", join, "sh"] + inner

    def popen(self, device, argv, log_path):
        log = open(log_path, "w")
        return subprocess.Popen(self.command(device, argv), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _kill_netns_processes(netns):
    out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
    for pid in out.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def _remove_cgroup(path):
    for _ in range(50):  # a cgroup goes once its last task has exited
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            try:
                with open(os.path.join(path, "cgroup.procs")) as f:
                    for pid in f.read().split():
                        os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
            time.sleep(0.1)


def _claim_number():
    os.makedirs(REGISTRY, exist_ok=True)
    for n in range(1, 251):
        try:
            fd = os.open(os.path.join(REGISTRY, str(n)), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            continue
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        return n
    fail(f"250 testbeds are open ({REGISTRY}); close some, or run `deploy/testbed.py clean`")


def _release_number(n):
    try:
        os.remove(os.path.join(REGISTRY, str(n)))
    except FileNotFoundError:
        pass


def _owner_alive(n):
    try:
        with open(os.path.join(REGISTRY, str(n))) as f:
            pid = int(f.read().strip() or 0)
    except (OSError, ValueError):
        return False
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _number_of(name):
    digits = name[len(PREFIX):].split("-")[0]
    return int(digits) if digits.isdigit() else None


def leftovers():
    """Namespaces and cgroups of testbeds whose process is gone."""
    netns = [line.split()[0] for line in sh("ip", "netns", "list", check=False).stdout.splitlines()
             if line.startswith(PREFIX)]
    root, _ = cgroup_root()
    groups = [os.path.join(root, d) for d in os.listdir(root) if d.startswith(PREFIX)] \
        if os.path.isdir(root) else []
    dead = lambda name: not _owner_alive(_number_of(name))  # noqa: E731
    return ([n for n in netns if dead(n)], [g for g in groups if dead(os.path.basename(g))])


def clean_stale():
    """Removes what testbeds killed before they could clean up left behind."""
    netns, groups = leftovers()
    for n in netns:
        _kill_netns_processes(n)
        sh("ip", "netns", "del", n, check=False)
    for g in groups:
        _remove_cgroup(g)
    if os.path.isdir(REGISTRY):
        for f in os.listdir(REGISTRY):
            if f.isdigit() and not _owner_alive(int(f)):
                _release_number(int(f))
    if netns or groups:
        say(f"testbed: removed {len(netns)} namespaces and {len(groups)} cgroups left by "
            f"testbeds that were killed")
