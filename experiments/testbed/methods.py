"""The methods a testbed compares at equal devices N, as (rule, stages K, replicas R,
micro-batches): every method uses all N devices for its workers."""

import dataclasses

METHODS = ("data_parallel", "gpipe", "CHUNKED", "GREEDY", "OVERLAP")


@dataclasses.dataclass(frozen=True)
class Layout:
    rule: str
    stages: int
    replicas: int
    micro_batches: int = 1


def layout(method, devices):
    """How `method` fills `devices`: data parallelism as N replicas of the whole network;
    pipelined backprop (GPipe) as N stages with N micro-batches a batch; the local rules as N
    stages."""
    if method == "data_parallel":
        return Layout("BACKPROP", 1, devices)
    if method == "gpipe":
        return Layout("BACKPROP", devices, 1, devices)
    if method in ("CHUNKED", "GREEDY", "OVERLAP"):
        return Layout(method, devices, 1)
    raise ValueError(f"unknown method {method!r} (one of {', '.join(METHODS)})")


# Which frontier method's tuned setting (learning rate, schedule length) a testbed method
# borrows at a batch size: backprop trains the same update however it is split.
FRONTIER_LABEL = {"data_parallel": "data parallel", "gpipe": "data parallel",
                  "CHUNKED": "CHUNKED K={k}", "GREEDY": "GREEDY K={k}",
                  "OVERLAP": "OVERLAP K={k}"}
