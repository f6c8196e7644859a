"""The methods a testbed compares at equal devices N, as (rule, stages K, replicas R,
micro-batches): every method uses all N devices for its workers."""

import dataclasses

METHODS = ("data_parallel", "gpipe", "1f1b", "zb", "CHUNKED", "GREEDY", "OVERLAP")


@dataclasses.dataclass(frozen=True)
class Layout:
    rule: str
    stages: int
    replicas: int
    micro_batches: int = 1
    schedule: str = "gpipe"  # BACKPROP's pipeline schedule (job.pipeline_schedule)


def layout(method, devices):
    """How `method` fills `devices`: data parallelism as N replicas of the whole network;
    pipelined backprop as N stages with N micro-batches a batch, under GPipe's schedule, 1F1B's
    (fewer activations held) or the zero-bubble split (the same weights under each); the local
    rules as N stages."""
    if method == "data_parallel":
        return Layout("BACKPROP", 1, devices)
    if method in ("gpipe", "1f1b", "zb"):
        return Layout("BACKPROP", devices, 1, devices, method)
    if method in ("CHUNKED", "GREEDY", "OVERLAP"):
        return Layout(method, devices, 1)
    raise ValueError(f"unknown method {method!r} (one of {', '.join(METHODS)})")


# Which frontier method's tuned setting (learning rate, schedule length) a testbed method
# borrows at a batch size: backprop trains the same update however it is split.
FRONTIER_LABEL = {"data_parallel": "data parallel", "gpipe": "data parallel",
                  "1f1b": "data parallel", "zb": "data parallel",
                  "CHUNKED": "CHUNKED K={k}", "GREEDY": "GREEDY K={k}",
                  "OVERLAP": "OVERLAP K={k}"}


def apply(job, lay, micro_batches=None):
    """Sets `job` (a job_pb2.Job) to train as `lay` does: its rule, micro-batches (or
    `micro_batches`) and pipeline schedule."""
    from experiments import jobs
    jobs.set_rule(job, lay.rule)
    job.micro_batches = micro_batches or lay.micro_batches
    jobs.set_pipeline_schedule(job, lay.schedule)
