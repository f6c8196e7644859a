#!/usr/bin/env python3
"""Writes the JobSet overlay's manifests for K stages of R replicas: the one place that sets
the layout (the image is set in kustomization.yaml, the job in the base's job.textproto).

  python3 k8s/overlays/jobset/generate.py [--stages=4] [--replicas=1] [--regroup]

writes k8s/overlays/jobset/jobset.yaml and networkpolicy-jobset.yaml. --regroup passes
--stages=K to the coordinator, for a job file whose own stage count differs from K.
deploy/check-deploy.sh fails when the committed files differ from what the defaults give.

What it writes:
  - a JobSet "localpar": one replicated job per stage (stage-0 ... stage-K-1), each a Job of
    R pods in Indexed mode (pod index = replica), then the coordinator, started in that
    order (startupPolicy InOrder: a stage's job starts once the previous one is ready);
  - pod DNS names localpar-stage-K-0-R.localpar (network.enableDNSHostnames), which the
    coordinator's --workers lists stage by stage;
  - restarts: every pod has restartPolicy OnFailure, so a worker that crashes or is killed
    restarts in place, in its own pod, and the others keep running while the coordinator
    recovers from the last checkpoint (the property Compose has). A Job that fails outright
    (backoffLimit spent) restarts that replicated job alone (failurePolicy RestartJob),
    at most maxRestarts times;
  - success when the coordinator's job completes (successPolicy on "coordinator"): a
    finished run is never started again, and the workers, which exit 0 at the job's
    SHUTDOWN, complete too;
  - snapshots on one shared claim from the JobSet's volumeClaimPolicies (each worker writes
    under /snapshots/stage-K-replica-R; it must be ReadWriteMany when pods land on several
    nodes), the coordinator's checkpoints and weights on the base's localpar-checkpoints;
  - NetworkPolicies: a stage's gRPC port admits the coordinator and the stage before it, a
    stage's replicas reach each other on any port (their mesh listens on an ephemeral
    one), metrics are open to the scraper.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
JOBSET = "localpar"
GRPC, METRICS, STATUS = 50051, 9100, 50052


def worker_job(stage, replicas):
    return f"""  - name: stage-{stage}
    replicas: 1
    template:
      spec:
        completionMode: Indexed
        completions: {replicas}
        parallelism: {replicas}
        backoffLimit: 6
        template:
          metadata:
            labels: {{app.kubernetes.io/name: localpar-worker, app.kubernetes.io/component: worker}}
          spec:
            restartPolicy: OnFailure
            terminationGracePeriodSeconds: 30
            securityContext: {{runAsNonRoot: true, runAsUser: 10001, fsGroup: 10001}}
            containers:
              - name: worker
                image: localpar:cpu
                env:
                  - name: REPLICA
                    valueFrom:
                      fieldRef: {{fieldPath: "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}
                args: [--listen=0.0.0.0:{GRPC}, --metrics_listen=0.0.0.0:{METRICS}, --threads=1,
                       "--checkpoint_dir=/snapshots/stage-{stage}-replica-$(REPLICA)"]
                ports:
                  - {{name: grpc, containerPort: {GRPC}}}
                  - {{name: metrics, containerPort: {METRICS}}}
                startupProbe:
                  grpc: {{port: {GRPC}}}
                  periodSeconds: 2
                  failureThreshold: 30
                readinessProbe:
                  grpc: {{port: {GRPC}}}
                  periodSeconds: 5
                livenessProbe:
                  grpc: {{port: {GRPC}}}
                  periodSeconds: 10
                  failureThreshold: 3
                resources:
                  requests: {{cpu: "1", memory: 1Gi}}
                  limits: {{memory: 4Gi}}
                volumeMounts:
                  - {{name: snapshots, mountPath: /snapshots}}
"""


def coordinator_job(stages, replicas, regroup):
    workers = ",".join(f"{JOBSET}-stage-{k}-0-{r}.{JOBSET}:{GRPC}"
                       for k in range(stages) for r in range(replicas))
    layout = ""
    if regroup:
        layout += f"\n                  - --stages={stages}"
    if replicas > 1:
        layout += f"\n                  - --replicas={replicas}"
    return f"""  - name: coordinator
    replicas: 1
    template:
      spec:
        backoffLimit: 6
        template:
          metadata:
            labels: {{app.kubernetes.io/name: localpar-coordinator, app.kubernetes.io/component: coordinator}}
          spec:
            restartPolicy: OnFailure
            securityContext: {{runAsNonRoot: true, runAsUser: 10001, fsGroup: 10001}}
            containers:
              - name: coordinator
                image: localpar:cpu
                command: [localpar_coordinator]
                args:
                  - --job=/etc/localpar/job/job.textproto{layout}
                  - --workers={workers}
                  - --out=/checkpoints/run
                  - --metrics_listen=0.0.0.0:{METRICS}
                  - --status_listen=0.0.0.0:{STATUS}
                  - --advertise=localpar-coordinator:{STATUS}
                  - --checkpoint_dir=/checkpoints/ckpt
                  - --checkpoint_every_seconds=300
                  - --resume_if_present
                ports:
                  - {{name: metrics, containerPort: {METRICS}}}
                  - {{name: status, containerPort: {STATUS}}}
                livenessProbe:
                  tcpSocket: {{port: metrics}}
                  periodSeconds: 10
                resources:
                  requests: {{cpu: "1", memory: 2Gi}}
                  limits: {{memory: 4Gi}}
                volumeMounts:
                  - {{name: job, mountPath: /etc/localpar/job, readOnly: true}}
                  - {{name: checkpoints, mountPath: /checkpoints}}
                  - {{name: data, mountPath: /usr/share/datasets/fashion-mnist, readOnly: true}}
            volumes:
              - name: job
                configMap: {{name: localpar-job}}
              - name: checkpoints
                persistentVolumeClaim: {{claimName: localpar-checkpoints}}
              - name: data
                persistentVolumeClaim: {{claimName: localpar-data, readOnly: true}}
"""


def jobset(stages, replicas, regroup):
    header = f"""# Generated by generate.py --stages={stages} --replicas={replicas}{' --regroup' if regroup else ''}: edit that, not this.
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata:
  name: {JOBSET}
spec:
  network:
    enableDNSHostnames: true
    subdomain: {JOBSET}
  startupPolicy:
    startupPolicyOrder: InOrder
  successPolicy:
    operator: All
    targetReplicatedJobs: [coordinator]
  failurePolicy:
    maxRestarts: 3
    rules:
      - name: restart-only-the-failed-job
        action: RestartJob
  volumeClaimPolicies:
    - templates:
        - metadata:
            name: snapshots
          spec:
            accessModes: [ReadWriteMany]
            resources:
              requests: {{storage: 20Gi}}
      retentionPolicy:
        whenDeleted: Retain
  replicatedJobs:
"""
    return header + "".join(worker_job(k, replicas) for k in range(stages)) + \
        coordinator_job(stages, replicas, regroup)


def policies(stages, replicas):
    out = [f"# Generated by generate.py --stages={stages} --replicas={replicas}: edit that, not this."]
    for k in range(stages):
        sources = ["        - podSelector: {matchLabels: {jobset.sigs.k8s.io/replicatedjob-name: "
                   "coordinator}}"]
        if k > 0:
            sources.append("        - podSelector: {matchLabels: {jobset.sigs.k8s.io/replicatedjob-name: "
                           f"stage-{k - 1}}}}}")
        same_stage = ""
        if replicas > 1:
            same_stage = ("    - from: [{podSelector: {matchLabels: {jobset.sigs.k8s.io/replicatedjob-name: "
                          f"stage-{k}}}}}}}]\n")
        out.append(f"""apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: localpar-stage-{k}
spec:
  podSelector:
    matchLabels: {{jobset.sigs.k8s.io/jobset-name: {JOBSET}, jobset.sigs.k8s.io/replicatedjob-name: stage-{k}}}
  policyTypes: [Ingress]
  ingress:
    - from:
{chr(10).join(sources)}
      ports: [{{port: {GRPC}, protocol: TCP}}]
{same_stage}    - ports: [{{port: {METRICS}, protocol: TCP}}]""")
    return "\n---\n".join(out) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stages", type=int, default=4, help="stages, one replicated job each (4)")
    p.add_argument("--replicas", type=int, default=1,
                   help="replicas of every stage, the pods of its job (1)")
    p.add_argument("--regroup", action="store_true",
                   help="pass --stages to the coordinator: the job file has another stage count")
    p.add_argument("--check", action="store_true",
                   help="exit 1 if the committed files differ from what these flags give")
    a = p.parse_args()
    if a.stages < 1 or a.replicas < 1:
        p.error("--stages and --replicas must be >= 1")
    files = {"jobset.yaml": jobset(a.stages, a.replicas, a.regroup),
             "networkpolicy-jobset.yaml": policies(a.stages, a.replicas)}
    status = 0
    for name, text in files.items():
        path = os.path.join(HERE, name)
        if a.check:
            if not os.path.exists(path) or open(path).read() != text:
                print(f"{path} differs from generate.py's output: run "
                      f"python3 k8s/overlays/jobset/generate.py")
                status = 1
        else:
            open(path, "w").write(text)
    return status


if __name__ == "__main__":
    sys.exit(main())
