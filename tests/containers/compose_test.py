#!/usr/bin/env python3
"""The shipped Compose cluster as separate containers, each with its own filesystem.

Builds (or reuses, keyed by a hash of what goes into each) a Debian base image made with
debootstrap, localpar:cpu from deploy/Dockerfile and a Prometheus image from Debian's package.
Then it brings up deploy/compose/docker-compose.yml with an override that changes only what
must differ here (the images, a shorter job, the checkpoint cadence, the Prometheus port) and:
  1. trains with a worker container's process SIGKILLed (from the host, as the kernel's OOM
     killer would) after the second committed checkpoint; the restart policy of the shipped
     file brings it back, the coordinator recovers the stage from that worker's own volume,
     and the final weights.pb is bitwise equal to `localpar train` of the same job in the
     same image;
  2. checks Prometheus (its HTTP API) for per-stage throughput above 0 and evaluates every
     PromQL expression of dashboards/localpar.json at a moment when the job was training;
  3. does it again with `docker kill` of the coordinator container instead; Docker counts
     that as a deliberate stop and does not restart it, so `docker-compose start coordinator`
     does, as an operator would; it resumes from its newest manifest (--resume_if_present),
     and the weights are again equal;
  4. runs the stage-replicas layout (deploy/compose/docker-compose.replicas.yml: 2 stages x
     2 replicas on the same 4 containers, the replicas meeting through the coordinator and
     exchanging gradients over their mesh between containers), SIGKILLs stage 1's second replica,
     and checks that every replica rolls back and the weights equal `localpar train
     --stages=2 --replicas=2`.
Everything it creates (containers, networks, volumes) is removed afterwards; a dockerd it had
to start is stopped. LOCALPAR_SKIP_CONTAINERS=1 skips it.

Usage: compose_test.py [--keep-images-only]   (run from anywhere; exits non-zero on failure)
"""
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MIRROR = os.environ.get("LOCALPAR_DEBIAN_MIRROR", "http://deb.debian.org/debian")
SUITE = "bookworm"
DATASET = "/usr/share/datasets/fashion-mnist"
JOB = "/etc/localpar/jobs/fashion_mlp.textproto"
MAX_STEPS = 600           # about twenty seconds of training on 2 cores
CHECKPOINT_EVERY = 100    # 6 checkpoints; the kill lands after the second
WORKERS = ["worker-0", "worker-1", "worker-2", "worker-3"]
# What deploy/Dockerfile copies in (less what .dockerignore leaves out): the image's hash.
IMAGE_INPUTS = ["CMakeLists.txt", "cmake", "common", "proto", "services", "tests", "deploy/jobs",
                ".dockerignore", ":(exclude)tests/containers",
                ":(exclude)tests/bench/project_containers.py"]


class Failure(Exception):
    pass


def log(msg):
    print(f"containers: {msg}", flush=True)


def run(cmd, check=True, timeout=600, env=None, input_bytes=None):
    """Runs cmd, returning (exit code, stdout+stderr as text)."""
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout,
                           env=env, input=input_bytes)
    except subprocess.TimeoutExpired as e:
        raise Failure(f"{' '.join(cmd)}: still running after {timeout} s\n"
                      f"{(e.output or b'').decode(errors='replace')[-3000:]}")
    out = p.stdout.decode(errors="replace")
    if check and p.returncode != 0:
        raise Failure(f"{' '.join(cmd)} exited {p.returncode}:\n{out[-4000:]}")
    return p.returncode, out


def run_logged(cmd, logfile, what, timeout):
    """Runs a long build with its output in logfile, printing docker build's step lines."""
    start = time.time()
    with open(logfile, "w") as f:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in p.stdout:
            f.write(line)
            if line.startswith("Step ") or line.startswith("I: Retrieving Release"):
                log(f"  {what}: {line.strip()[:100]}")
            if time.time() - start > timeout:
                p.kill()
                raise Failure(f"{what}: not done after {timeout} s (log: {logfile})")
        rc = p.wait()
    if rc != 0:
        with open(logfile) as f:
            tail = f.read()[-4000:]
        raise Failure(f"{what} failed (exit {rc}); the end of {logfile}:\n{tail}")
    log(f"  {what}: done in {time.time() - start:.0f} s")


# ---- dockerd --------------------------------------------------------------------------------

def docker_up():
    return subprocess.run(["docker", "info"], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode == 0


def start_dockerd(workdir):
    """Returns the dockerd we started, or None when one already answers."""
    if shutil.which("docker") is None:
        raise Failure("no docker client: install Debian's docker.io (deploy/install-deps.sh)")
    if docker_up():
        log("using the running Docker engine")
        return None
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        raise Failure("no Docker engine answers and there is no dockerd to start: install "
                      "Debian's docker.io (deploy/install-deps.sh does)")
    if os.geteuid() != 0:
        raise Failure("no Docker engine answers, and starting dockerd needs root")
    # Without systemd nothing may have mounted the cgroup hierarchies dockerd needs; Debian's
    # cgroupfs-mount (which docker.io recommends) does.
    if not (os.path.exists("/sys/fs/cgroup/cgroup.controllers")
            or os.path.ismount("/sys/fs/cgroup/memory")):
        tool = shutil.which("cgroupfs-mount")
        if tool is None:
            raise Failure("no cgroup hierarchy is mounted and cgroupfs-mount is missing: "
                          "apt-get install cgroupfs-mount")
        run([tool], check=False)
        log("mounted the cgroup hierarchies (cgroupfs-mount)")
    logpath = os.path.join(workdir, "dockerd.log")
    proc = subprocess.Popen([dockerd], stdout=open(logpath, "w"), stderr=subprocess.STDOUT)
    for _ in range(120):
        if proc.poll() is not None:
            raise Failure(f"dockerd exited {proc.returncode} while starting:\n"
                          f"{open(logpath).read()[-3000:]}")
        if docker_up():
            log(f"started dockerd (pid {proc.pid}, log {logpath})")
            return proc
        time.sleep(0.5)
    proc.terminate()
    raise Failure(f"dockerd did not answer within 60 s:\n{open(logpath).read()[-3000:]}")


def stop_dockerd(proc):
    if proc is None:
        return
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log(f"stopped dockerd (pid {proc.pid})")


# ---- images, each keyed by a hash of what goes into it ----------------------------------------

def files_hash(seed, paths):
    """sha256 over seed and every file git knows (or would track) under paths, by content."""
    _, out = run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others",
                  "--exclude-standard", "--", *paths])
    h = hashlib.sha256(seed.encode())
    for rel in sorted(set(p for p in out.split("\0") if p)):
        full = os.path.join(ROOT, rel)
        if not os.path.isfile(full):
            continue
        h.update(rel.encode() + b"\0")
        with open(full, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()[:16]


def have_image(tag):
    return subprocess.run(["docker", "image", "inspect", tag], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode == 0


def base_image(workdir):
    key = hashlib.sha256(f"debootstrap --variant=minbase {SUITE} {MIRROR}".encode()).hexdigest()
    tag = f"localpar-base:{SUITE}-{key[:12]}"
    if have_image(tag) and have_image(tag + "-slim"):
        log(f"base image {tag}: cached")
        return tag
    if shutil.which("debootstrap") is None:
        raise Failure("debootstrap is missing: apt-get install debootstrap")
    root = tempfile.mkdtemp(prefix="localpar-base-", dir="/var/tmp")
    try:
        log(f"base image {tag}: debootstrap --variant=minbase {SUITE} from {MIRROR}")
        run_logged(["debootstrap", "--variant=minbase", SUITE, root, MIRROR],
                   os.path.join(workdir, "debootstrap.log"), "debootstrap", 900)
        tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
        imp = subprocess.run(["docker", "import", "-", tag], stdin=tar.stdout,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        tar.wait()
        if tar.returncode != 0 or imp.returncode != 0:
            raise Failure(f"docker import of {root} failed: {imp.stdout.decode()[-2000:]}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    # deploy/Dockerfile's runtime stage is FROM ${DEBIAN}-slim: the minimal base serves both.
    run(["docker", "tag", tag, tag + "-slim"])
    return tag


def built_image(name, dockerfile, paths, base, workdir):
    key = files_hash(base + dockerfile, [dockerfile, *paths])
    tag = f"{name}:{key}"
    if have_image(tag):
        log(f"image {tag}: cached")
        return tag
    log(f"image {tag}: docker build -f {dockerfile} --build-arg DEBIAN={base}")
    run_logged(["docker", "build", "--force-rm", "-f", os.path.join(ROOT, dockerfile), "--build-arg",
                f"DEBIAN={base}", "-t", tag, ROOT],
               os.path.join(workdir, f"build-{name}.log"), f"build {name}", 1800)
    return tag


# ---- the cluster ------------------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PROM_CONF = "/etc/prometheus/prometheus.yml"


def fast_scrape_config(workdir, name):
    """deploy/compose/prometheus.yml with its scrape interval set to 1 s (same targets)."""
    with open(os.path.join(ROOT, "deploy/compose/prometheus.yml")) as f:
        text = f.read()
    fast, n = re.subn(r"(?m)^(\s*scrape_interval:\s*)\S+", r"\g<1>1s", text)
    if n != 1:
        raise Failure("deploy/compose/prometheus.yml: expected one scrape_interval line")
    path = os.path.join(workdir, f"{name}.prometheus.yml")
    with open(path, "w") as f:
        f.write(fast)
    return path


class Cluster:
    """One Compose project: the shipped file plus this test's override."""

    def __init__(self, workdir, name, image, prom_image, port, layout=()):
        self.project = name
        self.port = port
        override = os.path.join(workdir, f"{name}.override.yml")
        coordinator_flags = [
            f"--job={JOB}", *layout,
            "--workers=" + ",".join(f"{w}:50051" for w in WORKERS),
            "--out=/checkpoints/run",
            "--metrics_listen=0.0.0.0:9100",
            "--checkpoint_dir=/checkpoints/ckpt",
            "--resume_if_present",
            # What differs here: a shorter job and a checkpoint every CHECKPOINT_EVERY steps.
            f"--max_steps={MAX_STEPS}",
            f"--checkpoint_every_steps={CHECKPOINT_EVERY}",
            "--keep_checkpoints=100",
        ]
        with open(override, "w") as f:
            f.write("# Written by tests/containers/compose_test.py\nservices:\n")
            for w in WORKERS:
                f.write(f"  {w}:\n    image: {image}\n")
            f.write(f"  coordinator:\n    image: {image}\n    command: {json.dumps(coordinator_flags)}\n")
            # Scraped every second here: a short run's restarted worker must show some rise
            # between two samples (at the shipped 5 s a 4 s replay may show none).
            mount = json.dumps(f"{fast_scrape_config(workdir, name)}:{PROM_CONF}:ro")
            f.write(f"  prometheus:\n    image: {prom_image}\n    volumes: [{mount}]\n")
        files = ["deploy/compose/docker-compose.yml"]
        if layout:
            files.append("deploy/compose/docker-compose.replicas.yml")
        self.compose = ["docker-compose", "-p", name]
        for f_ in files:
            self.compose += ["-f", os.path.join(ROOT, f_)]
        self.compose += ["-f", override]
        self.env = dict(os.environ, LOCALPAR_PROMETHEUS_PORT=f"127.0.0.1:{port}")

    def dc(self, *args, check=True, timeout=300):
        return run([*self.compose, *args], check=check, timeout=timeout, env=self.env)

    def up(self):
        self.dc("up", "-d", "--no-build", "coordinator", *WORKERS, "prometheus", timeout=300)

    def down(self):
        self.dc("down", "-v", "--remove-orphans", "--timeout", "5", check=False, timeout=180)

    def container(self, service):
        _, out = self.dc("ps", "-q", service)
        ids = out.split()
        if len(ids) != 1:
            raise Failure(f"{service}: expected one container, docker-compose ps says {out!r}")
        return ids[0]

    def state(self, service):
        _, out = run(["docker", "inspect", "-f",
                      "{{.State.Status}} {{.State.ExitCode}} {{.RestartCount}}",
                      self.container(service)])
        status, code, restarts = out.split()
        return status, int(code), int(restarts)

    def committed(self):
        """Committed checkpoints: ckpt-* directories with a MANIFEST in the coordinator's volume,
        read through the coordinator container while it runs."""
        rc, out = run(["docker", "exec", self.container("coordinator"), "sh", "-c",
                       "ls -d /checkpoints/ckpt/ckpt-*/MANIFEST 2>/dev/null | wc -l"],
                      check=False, timeout=30)
        return int(out.strip()) if rc == 0 and out.strip().isdigit() else -1

    def logs(self, service):
        _, out = self.dc("logs", "--no-color", service, check=False)
        return out

    def wait_committed(self, n, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.committed() >= n:
                return
            status, code, _ = self.state("coordinator")
            if status == "exited" and code == 0:
                raise Failure(f"the run ended before {n} checkpoints were committed")
            time.sleep(0.3)
        raise Failure(f"fewer than {n} committed checkpoints after {timeout} s:\n"
                      f"{self.logs('coordinator')[-3000:]}")

    def wait_done(self, timeout, training_times):
        """Waits for the coordinator to exit 0 for good, noting when it was seen training."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            status, code, restarts = self.state("coordinator")
            if status == "exited":
                if code != 0:
                    raise Failure(f"the coordinator exited {code}:\n"
                                  f"{self.logs('coordinator')[-4000:]}")
                return
            if status == "running" and self.committed() >= 1:
                training_times.append(time.time())
            time.sleep(1)
        raise Failure(f"the run did not finish within {timeout} s:\n"
                      f"{self.logs('coordinator')[-4000:]}")

    def copy_out(self, service, path, dest):
        run(["docker", "cp", f"{self.container(service)}:{path}", dest])


# What the replicas scenario changes, from deploy/compose/docker-compose.replicas.yml (the
# test's override replaces the coordinator's command, so these must match that file).
REPLICAS_LAYOUT = ("--stages=2", "--replicas=2", "--status_listen=0.0.0.0:50052",
                   "--advertise=coordinator:50052")


def reference_weights(image, workdir, layout=()):
    """`localpar train` of the same job in the same image: the weights every run must equal."""
    name = f"localpar-ref-{os.getpid()}"
    dest = os.path.join(workdir, f"reference{len(layout)}.weights.pb")
    job_flags = [f for f in layout if f.startswith(("--stages", "--replicas"))]
    try:
        run(["docker", "run", "--name", name, "--network", "none", "-v",
             f"{DATASET}:{DATASET}:ro", "--entrypoint", "localpar", image, "train", JOB,
             *job_flags, f"--max_steps={MAX_STEPS}", "--out=/var/lib/localpar/ref", "--quiet"],
            timeout=600)
        run(["docker", "cp", f"{name}:/var/lib/localpar/ref/weights.pb", dest])
    finally:
        run(["docker", "rm", "-f", name], check=False)
    return dest


def weight_stages(path):
    """The serialised `stages` fields of a weights file (field 1 of localpar.v1.ModelWeights),
    leaving out what describes the run (input transform, job text), which may word the same
    job differently."""
    with open(path, "rb") as f:
        data = f.read()
    out, i = [], 0

    def varint():
        nonlocal i
        value, shift = 0, 0
        while True:
            b = data[i]
            i += 1
            value |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                return value

    while i < len(data):
        key = varint()
        field, wire = key >> 3, key & 7
        if wire == 2:
            n = varint()
            if field == 1:
                out.append(data[i:i + n])
            i += n
        elif wire == 0:
            varint()
        elif wire == 5:
            i += 4
        elif wire == 1:
            i += 8
        else:
            raise Failure(f"{path}: not a weights file (wire type {wire})")
    return out


def same_bytes(a, b):
    """Whether two weights files hold bitwise the same parameters."""
    return weight_stages(a) == weight_stages(b)


# ---- Prometheus -------------------------------------------------------------------------------

def prom_query(port, expr, at):
    url = (f"http://127.0.0.1:{port}/api/v1/query?" +
           urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"}))
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def check_prometheus(port, at, since):
    """Per-stage throughput above 0 at some time of the run (the dashboard's expression, its
    highest value since `since`), and every dashboard expression evaluates to some series at
    `at`, a time the coordinator was seen training."""
    # Two more scrapes, so that the last samples of a stage that finished are in.
    time.sleep(2.5)
    now = time.time()
    span = max(10, int(now - since) + 1)
    throughput = ('max_over_time((sum by (stage) (rate(localpar_examples_total{phase="train"}'
                  f'[1m])))[{span}s:1s])')
    reply = prom_query(port, throughput, now)
    stages = {s["metric"].get("stage"): float(s["value"][1]) for s in reply["data"]["result"]}
    log(f"prometheus: highest per-stage throughput in the last {span} s: "
        + ", ".join(f"stage {k} {v:.0f} ex/s" for k, v in sorted(stages.items())))
    if sorted(stages) != ["0", "1", "2", "3"] or not all(v > 0 for v in stages.values()):
        raise Failure(f"expected throughput above 0 for stages 0-3, got {stages}")
    with open(os.path.join(ROOT, "dashboards/localpar.json")) as f:
        dashboard = json.load(f)
    exprs = [(p.get("title", "?"), t["expr"]) for p in dashboard["panels"]
             for t in p.get("targets", []) if t.get("expr")]
    empty, replica_only = [], 0
    for title, expr in exprs:
        # The all-reduce series exist only where stages have replicas; this cluster has none.
        if 'phase="allreduce"' in expr:
            replica_only += 1
            continue
        # The dashboard's $job variable, with every job selected.
        concrete = expr.replace("$job", ".+")
        reply = prom_query(port, concrete, at)
        if reply.get("status") != "success":
            raise Failure(f"panel {title!r}: {concrete} failed: {reply}")
        if not reply["data"]["result"]:
            empty.append(f"{title}: {concrete}")
    if empty:
        raise Failure("dashboard expressions that returned no series:\n  " + "\n  ".join(empty))
    log(f"prometheus: all {len(exprs) - replica_only} dashboard expressions succeed and return "
        f"series ({replica_only} of replicas' all-reduce time left out: no replicas here)")


# ---- the scenarios ----------------------------------------------------------------------------

def scenario(workdir, image, prom_image, ref, victim, check_prom, layout=()):
    port = free_port()
    cluster = Cluster(workdir, f"lpct{os.getpid()}{victim.replace('-', '')}{len(layout)}", image,
                      prom_image, port, layout)
    start = time.time()
    try:
        cluster.down()
        cluster.up()
        log(f"[{victim}] cluster up: coordinator, {len(WORKERS)} workers, prometheus "
            f"(127.0.0.1:{port})")
        cluster.wait_committed(2, 240)
        if victim == "coordinator":
            log(f"[{victim}] 2 checkpoints committed; docker kill, then docker-compose start")
            run(["docker", "kill", cluster.container(victim)])
            cluster.dc("start", victim)
        else:
            _, pid = run(["docker", "inspect", "-f", "{{.State.Pid}}", cluster.container(victim)])
            log(f"[{victim}] 2 checkpoints committed; kill -9 of its process (host pid "
                f"{pid.strip()})")
            os.kill(int(pid), signal.SIGKILL)
        training = []
        cluster.wait_done(420, training)
        _, _, restarts = cluster.state(victim)
        if victim != "coordinator" and restarts < 1:
            raise Failure(f"{victim} was not restarted (restart count {restarts})")
        logs = cluster.logs("coordinator")
        n = cluster_committed_after(cluster, workdir)
        if n < 3:
            raise Failure(f"only {n} checkpoints were committed:\n{logs[-3000:]}")
        out = os.path.join(workdir, f"{victim}.weights.pb")
        cluster.copy_out("coordinator", "/checkpoints/run/weights.pb", out)
        if not same_bytes(out, ref):
            raise Failure(f"[{victim}] weights.pb differs from localpar train's:\n{logs[-3000:]}")
        if victim == "coordinator" and "resuming from" not in logs:
            raise Failure(f"the restarted coordinator did not resume:\n{logs[-3000:]}")
        if victim != "coordinator" and "rolling every stage back to" not in logs:
            raise Failure(f"the coordinator did not recover the lost stage:\n{logs[-3000:]}")
        log(f"[{victim}] back after the kill (restart count {restarts}); {n} checkpoints committed; "
            f"weights.pb bitwise equal to localpar train ({time.time() - start:.0f} s)")
        if check_prom:
            if not training:
                raise Failure("the coordinator was never seen training after the kill")
            check_prometheus(port, training[-1], start)
    except Failure:
        for s in ["coordinator", victim]:
            log(f"--- docker-compose logs {s} (end) ---\n{cluster.logs(s)[-2500:]}")
        raise
    finally:
        cluster.down()


def cluster_committed_after(cluster, workdir):
    """Committed checkpoints in the stopped coordinator's volume, counted from a copy."""
    dest = os.path.join(workdir, f"{cluster.project}-ckpt")
    cluster.copy_out("coordinator", "/checkpoints/ckpt", dest)
    return sum(os.path.isfile(os.path.join(dest, d, "MANIFEST")) for d in os.listdir(dest))


def main():
    if os.environ.get("LOCALPAR_SKIP_CONTAINERS") == "1":
        log("skipped (LOCALPAR_SKIP_CONTAINERS=1)")
        return 0
    if not os.path.isdir(DATASET):
        raise Failure(f"{DATASET} is missing: apt-get install dataset-fashion-mnist")
    workdir = tempfile.mkdtemp(prefix="localpar-containers-")
    started = time.time()
    dockerd = start_dockerd(workdir)
    try:
        base = base_image(workdir)
        image = built_image("localpar-cpu", "deploy/Dockerfile", IMAGE_INPUTS, base, workdir)
        prom = built_image("localpar-prometheus", "deploy/prometheus.Dockerfile",
                           ["deploy/compose/prometheus.yml"], base, workdir)
        log(f"images ready after {time.time() - started:.0f} s")
        t = time.time()
        ref = reference_weights(image, workdir)
        log(f"reference: localpar train {JOB} --max_steps={MAX_STEPS} in {image} "
            f"({time.time() - t:.0f} s)")
        scenario(workdir, image, prom, ref, "worker-2", check_prom=True)
        scenario(workdir, image, prom, ref, "coordinator", check_prom=False)
        t = time.time()
        ref_replicas = reference_weights(image, workdir, REPLICAS_LAYOUT)
        log(f"reference: localpar train {JOB} --stages=2 --replicas=2 ({time.time() - t:.0f} s)")
        scenario(workdir, image, prom, ref_replicas, "worker-3", check_prom=False,
                 layout=REPLICAS_LAYOUT)
    finally:
        stop_dockerd(dockerd)
    shutil.rmtree(workdir, ignore_errors=True)
    log(f"ok ({time.time() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Failure as e:
        print(f"containers: FAILED: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
