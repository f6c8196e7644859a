"""The methods a testbed compares at equal devices N, as (rule, stages K, replicas R,
micro-batches): every method uses all N devices for its workers."""

import dataclasses

METHODS = ("data_parallel", "gpipe", "1f1b", "zb", "CHUNKED", "GREEDY", "OVERLAP",
           "diloco_dp", "local_diloco")

# DiLoCo's methods synchronise their replicas every this many steps (the middle of the
# diloco matrix's 10, 50 and 100, and the best of them there at 2 and 4 replicas).
DILOCO_EVERY = 50


@dataclasses.dataclass(frozen=True)
class Layout:
    rule: str
    stages: int
    replicas: int
    micro_batches: int = 1
    schedule: str = "gpipe"  # BACKPROP's pipeline schedule (job.pipeline_schedule)
    sync_every: int = 1  # replicas synchronise every this many steps (DiLoCo) when > 1


def layout(method, devices):
    """How `method` fills `devices`: data parallelism as N replicas of the whole network;
    pipelined backprop as N stages with N micro-batches a batch, under GPipe's schedule, 1F1B's
    (fewer activations held) or the zero-bubble split (the same weights under each); the local
    rules as N stages; DiLoCo-style data parallelism as N replicas that synchronise every
    DILOCO_EVERY steps; local x DiLoCo as 2 CHUNKED stages of N / 2 such replicas (N even,
    at least 4)."""
    if method == "data_parallel":
        return Layout("BACKPROP", 1, devices)
    if method in ("gpipe", "1f1b", "zb"):
        return Layout("BACKPROP", devices, 1, devices, method)
    if method in ("CHUNKED", "GREEDY", "OVERLAP"):
        return Layout(method, devices, 1)
    if method == "diloco_dp":
        return Layout("BACKPROP", 1, devices, sync_every=DILOCO_EVERY)
    if method == "local_diloco":
        if devices < 4 or devices % 2:
            raise ValueError(f"local_diloco needs an even number of devices, at least 4 "
                             f"(2 stages x N / 2 replicas), not {devices}")
        return Layout("CHUNKED", 2, devices // 2, sync_every=DILOCO_EVERY)
    raise ValueError(f"unknown method {method!r} (one of {', '.join(METHODS)})")


def fits(method, devices):
    """Whether `method` can fill `devices`."""
    try:
        layout(method, devices)
        return True
    except ValueError:
        return False


# DiLoCo's methods borrow the learning rate tuned for the method each replica's inner steps
# are: backprop on one device's rows, and CHUNKED with 2 stages on one device's rows each.
BORROWS = {"diloco_dp": lambda n: ("data_parallel", 1),
           "local_diloco": lambda n: ("CHUNKED", 2)}


def tuned_as(method, devices):
    """(method, devices) whose tuned learning rate `method` at `devices` trains with."""
    return BORROWS[method](devices) if method in BORROWS else (method, devices)


# Which frontier method's tuned setting (learning rate, schedule length) a testbed method
# borrows at a batch size: backprop trains the same update however it is split.
FRONTIER_LABEL = {"data_parallel": "data parallel", "gpipe": "data parallel",
                  "1f1b": "data parallel", "zb": "data parallel",
                  "CHUNKED": "CHUNKED K={k}", "GREEDY": "GREEDY K={k}",
                  "OVERLAP": "OVERLAP K={k}", "diloco_dp": "data parallel",
                  "local_diloco": "CHUNKED K={k}"}


def apply(job, lay, micro_batches=None):
    """Sets `job` (a job_pb2.Job) to train as `lay` does: its rule, micro-batches (or
    `micro_batches`) and pipeline schedule."""
    from experiments import jobs
    jobs.set_rule(job, lay.rule)
    job.micro_batches = micro_batches or lay.micro_batches
    jobs.set_pipeline_schedule(job, lay.schedule)
    if lay.sync_every > 1:  # a job that synchronises replicas names them
        job.replicas = lay.replicas
        job.replica_sync.every = lay.sync_every
