#!/usr/bin/env python3
"""`localpar project` against a real link between two containers.

tests/bench/project_shaped.sh does this on one rate-limited loopback, where the coordinator's
input and the inter-stage activations share the limit. Here each stage is its own container
of the shipped Compose file (worker-0, worker-1, plus the coordinator), and the token bucket
(tc tbf; netem is not available on this kernel) sits on worker-0's eth0, in that container's
network namespace (entered from the host with nsenter). Worker-0's egress is the inter-stage
hop (activations to worker-1, and small acks to the coordinator), so the projection is given
the whole rate as the hop's bandwidth.

For each rate it trains the same 2-stage job and prints measured and projected examples/s.
Needs root and the Docker engine; it builds or reuses the images as tests/containers does.
Usage: tests/bench/project_containers.py [RATE_MBIT ...]   (default 50 100 200 0; 0: no limit)
"""
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "containers"))
import compose_test as ct  # noqa: E402

STEPS = 200
JOB = """name: "shaped"
rule: GREEDY
batch_size: 128
seed: 1
data {{ synthetic {{ train_examples: {examples} test_examples: 128 shape: [1024] classes: 10 }} }}
stages {{ layers {{ linear {{ out_features: 1024 }} }} layers {{ relu {{}} }} layers {{ linear {{ out_features: 1024 }} }} layers {{ relu {{}} }} }}
stages {{ layers {{ linear {{ out_features: 1024 }} }} layers {{ relu {{}} }} layers {{ linear {{ out_features: 1024 }} }} layers {{ relu {{}} }} }}
"""


def projected(image, jobdir, rate_mbit):
    _, out = ct.run(["docker", "run", "--rm", "--network", "none", "-v", f"{jobdir}:/jobs:ro",
                     "--entrypoint", "localpar", image, "project", "/jobs/job.textproto",
                     "--project_stages=2", "--cores=2", f"--link_gbps={rate_mbit / 1000}",
                     "--latency_us=50"])
    for line in out.splitlines():
        f = line.split()
        if len(f) == 4 and f[0] == "2":
            return float(f[3])
    raise ct.Failure(f"no 2-stage row in localpar project's output:\n{out}")


def measured(image, prom_image, workdir, jobdir, rate_mbit):
    cluster = ct.Cluster(workdir, f"lpbench{os.getpid()}r{rate_mbit}", image, prom_image,
                         ct.free_port())
    override = os.path.join(workdir, f"{cluster.project}.bench.yml")
    with open(override, "w") as f:
        f.write("services:\n  coordinator:\n")
        f.write(f"    volumes: [\"{jobdir}:/jobs:ro\"]\n")
        f.write("    command: " + json.dumps([
            "--job=/jobs/job.textproto", "--workers=worker-0:50051,worker-1:50051",
            "--out=/checkpoints/run", "--quiet"]) + "\n")
    cluster.compose += ["-f", override]
    try:
        cluster.down()
        # --no-deps: only these three, not the other workers the coordinator depends on.
        cluster.dc("up", "-d", "--no-build", "--no-deps", "worker-0", "worker-1")
        _, pid = ct.run(["docker", "inspect", "-f", "{{.State.Pid}}",
                         cluster.container("worker-0")])
        if rate_mbit > 0:
            ct.run(["nsenter", "-t", pid.strip(), "-n", "tc", "qdisc", "add", "dev", "eth0",
                    "root", "tbf", "rate", f"{rate_mbit}mbit", "burst", "1mb", "latency", "1s"])
        cluster.dc("up", "-d", "--no-build", "--no-deps", "coordinator")
        deadline = time.time() + 300
        while cluster.state("coordinator")[0] != "exited":
            if time.time() > deadline:
                raise ct.Failure("the run did not finish in 300 s")
            time.sleep(1)
        status, code, _ = cluster.state("coordinator")
        if code != 0:
            raise ct.Failure(f"the coordinator exited {code}:\n{cluster.logs('coordinator')}")
        report = os.path.join(workdir, f"{cluster.project}.report.json")
        cluster.copy_out("coordinator", "/checkpoints/run/report.json", report)
        with open(report) as f:
            return json.load(f)["examples_per_second"]
    finally:
        cluster.down()


def main():
    rates = [int(r) for r in sys.argv[1:]] or [50, 100, 200, 0]
    workdir = tempfile.mkdtemp(prefix="localpar-bench-")
    jobdir = os.path.join(workdir, "job")
    os.makedirs(jobdir)
    with open(os.path.join(jobdir, "job.textproto"), "w") as f:
        f.write(JOB.format(examples=STEPS * 128))
    os.chmod(jobdir, 0o755)
    dockerd = ct.start_dockerd(workdir)
    try:
        base = ct.base_image(workdir)
        image = ct.built_image("localpar-cpu", "deploy/Dockerfile", ct.IMAGE_INPUTS, base, workdir)
        prom = ct.built_image("localpar-prometheus", "deploy/prometheus.Dockerfile",
                              ["deploy/compose/prometheus.yml"], base, workdir)
        print("| worker-0 egress (tc tbf) | measured ex/s | projected ex/s | measured / projected |")
        print("|---|---|---|---|")
        for rate in rates:
            m = measured(image, prom, workdir, jobdir, rate)
            p = projected(image, jobdir, rate)
            label = f"{rate} Mbit/s" if rate > 0 else "unlimited (the bridge)"
            print(f"| {label} | {m:.0f} | {p:.0f} | {m / p:.2f} |", flush=True)
    finally:
        ct.stop_dockerd(dockerd)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ct.Failure as e:
        print(f"project_containers: FAILED: {e}", file=sys.stderr)
        sys.exit(1)
