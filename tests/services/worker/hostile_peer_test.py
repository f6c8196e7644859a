#!/usr/bin/python3
"""A hostile peer against live localpar processes.

The client is generated from proto/ (Debian's protoc with its gRPC Python plugin, from
protobuf-compiler-grpc) and uses none of the project's client code. It plays the upstream (the coordinator's side) and, for
the gradient cases, the downstream worker. After every case the worker must still be
alive, still train a good batch, and stay within a resident-memory bound.

usage: hostile_peer_test.py BUILD_DIR SOURCE_DIR
"""

import concurrent.futures
import math
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

BUILD, SOURCE = sys.argv[1], sys.argv[2]
WORK = tempfile.mkdtemp(prefix="localpar_hostile.")
GEN = os.path.join(WORK, "gen")
os.makedirs(GEN)
protos = [os.path.join("proto", p) for p in sorted(os.listdir(os.path.join(SOURCE, "proto")))
          if p.endswith(".proto")]
subprocess.run(["protoc", "-I", SOURCE, "-I", "/usr/include", "--python_out", GEN,
                "--grpc_python_out", GEN, "--plugin=protoc-gen-grpc_python=" +
                shutil.which("grpc_python_plugin")] + protos, check=True, cwd=SOURCE)
sys.path.insert(0, GEN)

import grpc  # noqa: E402
from google.protobuf import text_format  # noqa: E402
from proto import job_pb2, localpar_pb2, localpar_pb2_grpc, tensor_pb2  # noqa: E402

# What a worker of these small jobs may hold, whatever it was sent (a sanitizer build, whose
# shadow memory and quarantine take more, sets its own bound).
RSS_BOUND = int(os.environ.get("LOCALPAR_HOSTILE_RSS_MIB", "400")) << 20
SANITIZED = os.environ.get("LOCALPAR_SANITIZED") == "1"  # deploy/sanitize.sh's build
FAILURES = []
PROCESSES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print(f"  FAIL: {what}", flush=True)


def job(rule, micro=1, classes=3):
    return text_format.Parse(f"""
        rule: {rule} micro_batches: {micro} batch_size: 8 epochs: 2
        data {{ synthetic {{ shape: [6] classes: {classes} }} }}
        stages {{ layers {{ linear {{ out_features: 6 }} }} }}
        stages {{ layers {{ linear {{ out_features: 4 }} }} }}
    """, job_pb2.Job())


def tensor(dtype, shape, data):
    return tensor_pb2.Tensor(dtype=dtype, shape=shape, data=data)


def floats(values):
    return struct.pack(f"<{len(values)}f", *values)


def batch(seq, rows=2, features=6, step=0, phase=localpar_pb2.TRAIN, micro=0, micros=1,
          batch_rows=None, values=None, labels=None):
    values = values if values is not None else [0.25] * (rows * features)
    labels = labels if labels is not None else [1] * rows
    b = localpar_pb2.Batch(
        seq=seq, epoch=1, phase=phase, step=step, micro_batch=micro, micro_batches=micros,
        batch_rows=batch_rows if batch_rows is not None else rows,
        activations=tensor(tensor_pb2.F32, [rows, features], floats(values)),
        labels=tensor(tensor_pb2.I32, [rows], struct.pack(f"<{rows}i", *labels)))
    return localpar_pb2.DownItem(batch=b)


def control(seq, kind, **kw):
    return localpar_pb2.DownItem(control=localpar_pb2.Control(seq=seq, kind=kind, **kw))


def wait_port_file(path, count=2, timeout=15):
    end = time.time() + timeout
    while time.time() < end:
        try:
            ports = [int(p) for p in open(path).read().split()]
            if len(ports) >= count and ports[0] > 0:
                return ports
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    raise RuntimeError(f"{path}: no ports")


class Worker:
    def __init__(self, name, *flags):
        self.dir = os.path.join(WORK, name)
        os.makedirs(self.dir)
        self.log = open(os.path.join(self.dir, "log"), "w")
        self.proc = subprocess.Popen(
            [os.path.join(BUILD, "localpar_worker"), "--port_file=" + self.dir + "/port",
             "--checkpoint_dir=" + self.dir + "/ckpt"] + list(flags),
            stdout=self.log, stderr=subprocess.STDOUT)
        PROCESSES.append(self.proc)
        self.port, self.metrics_port = wait_port_file(self.dir + "/port")
        self.address = f"127.0.0.1:{self.port}"
        self.channel = grpc.insecure_channel(self.address, options=[
            ("grpc.max_receive_message_length", 1 << 30),
            ("grpc.max_send_message_length", 1 << 30)])
        self.stub = localpar_pb2_grpc.WorkerStub(self.channel)

    def configure(self, j, stage=1, downstream="", metadata=None, **kw):
        req = localpar_pb2.ConfigureRequest(job=j, stage=stage, downstream=downstream,
                                            total_steps=100, **kw)
        return self.stub.Configure(req, timeout=10, metadata=metadata)

    def exchange(self, items, metadata=None, timeout=20):
        """Sends the items, closes, and returns everything that came back."""
        return list(self.stub.Stream(iter(items), timeout=timeout, metadata=metadata))

    def exchange_when_free(self, items, metadata=None, wait_s=10):
        """exchange(), once the worker has let go of the previous upstream stream: a call the
        client saw end (a refused message, a cancel) can take a moment to end on the worker,
        which until then refuses a second upstream with FAILED_PRECONDITION."""
        deadline = time.time() + wait_s
        while True:
            try:
                return self.exchange(items, metadata)
            except grpc.RpcError as e:
                busy = (e.code() == grpc.StatusCode.FAILED_PRECONDITION
                        and "already has an upstream stream" in (e.details() or ""))
                if not busy or time.time() > deadline:
                    raise
                time.sleep(0.1)

    def stats(self, metadata=None):
        return self.stub.Stats(localpar_pb2.StatsRequest(), timeout=5, metadata=metadata)

    def rss(self):
        for line in open(f"/proc/{self.proc.pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def healthy(self, what, metadata=None):
        """Alive, trains a good batch, and within the memory bound."""
        check(self.proc.poll() is None, f"{what}: the worker is alive")
        if self.proc.poll() is not None:
            return
        before = self.stats(metadata).examples
        up = self.exchange_when_free([batch(1), control(2, localpar_pb2.Control.DRAIN)], metadata)
        check(any(u.HasField("ack") for u in up), f"{what}: a good batch is acknowledged")
        check(self.stats(metadata).examples == before + 2, f"{what}: the good batch trained")
        check(self.rss() < RSS_BOUND, f"{what}: resident {self.rss() >> 20} MiB < "
                                      f"{RSS_BOUND >> 20} MiB")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                return None
        return self.proc.returncode


def errors_of(up):
    return [u.error for u in up if u.HasField("error")]


def expect_refused(w, items, text, what):
    errors = errors_of(w.exchange(items))
    check(any(text in e.message for e in errors), f"{what}: refused naming '{text}' "
                                                  f"(got {[e.message for e in errors]})")


# ---- items from upstream ----------------------------------------------------------------

def case_integers_out_of_range():
    w = Worker("integers")
    w.configure(job("BACKPROP", micro=1))
    for micro in (7, -1, 100000):
        expect_refused(w, [batch(1, micro=micro, micros=0)], "batch.micro_batch",
                       f"micro_batch {micro} with micro_batches 0")
    expect_refused(w, [batch(1, step=-1)], "batch.step: -1", "a negative step")
    expect_refused(w, [batch(1, rows=2, batch_rows=9000)], "batch.batch_rows", "batch_rows")
    expect_refused(w, [batch(5), batch(5)], "seq: 5 is not after", "a repeated seq")
    w.healthy("integers out of range")
    w.stop()


def case_async_negative_step():
    w = Worker("async")
    w.configure(job("OVERLAP"), overlap_max_delay=2)
    expect_refused(w, [batch(1, step=-3)], "batch.step: -3", "asynchronous OVERLAP, step -3")
    w.healthy("asynchronous negative step")
    w.stop()


def case_no_path_from_the_wire():
    w = Worker("paths")
    w.configure(job("GREEDY"))
    target = os.path.join(WORK, "victim")
    open(target, "w").write("intact")
    # Field 4 of Control used to be a path; a peer may still send one (as unknown bytes).
    item = control(2, localpar_pb2.Control.CHECKPOINT, checkpoint_id=5)
    raw = item.SerializeToString()
    path = ("../../" + target + "\0.ckpt").encode()
    inner = item.control.SerializeToString() + b"\x22" + bytes([len(path)]) + path
    forged = b"\x12" + bytes([len(inner)]) + inner
    check(len(raw) > 0, "the forged item serialises")
    ch = w.channel.stream_stream("/localpar.v1.Worker/Stream",
                                 request_serializer=lambda b: b,
                                 response_deserializer=localpar_pb2.UpItem.FromString)
    up = list(ch(iter([batch(1).SerializeToString(), forged]), timeout=10))
    check(open(target).read() == "intact", "a path from the wire wrote nothing")
    check(os.path.exists(os.path.join(w.dir, "ckpt", "ckpt-000005", "stage-1.ckpt")),
          "the snapshot went to the worker's own directory")
    check(any(u.HasField("saved") for u in up), "the snapshot was reported")
    expect_refused(w, [control(1, localpar_pb2.Control.CHECKPOINT)], "checkpoint_id",
                   "a CHECKPOINT without an id")
    w.healthy("paths")
    w.stop()


def case_failed_configure_keeps_the_stage():
    w = Worker("configure")
    w.configure(job("GREEDY"))
    w.exchange([batch(1), control(2, localpar_pb2.Control.DRAIN)])
    steps = w.stats().steps
    try:
        w.configure(job("GREEDY"), restore=__import__("proto.checkpoint_pb2").checkpoint_pb2
                    .StageSnapshot(stage=1, checkpoint_id=99, bytes=10, crc32=1))
        check(False, "a restore of a missing snapshot is refused")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.DATA_LOSS, f"DATA_LOSS, got {e.code()}")
        check("stage 1, checkpoint 99" in e.details(), f"names stage and checkpoint: {e.details()}")
    check(w.stats().steps == steps, "the live stage's statistics stay")
    w.healthy("a failed Configure")
    try:
        w.configure(job("GREEDY", classes=2_000_000_000))
        check(False, "2e9 classes are refused")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, f"RESOURCE_EXHAUSTED, got {e.code()}")
        check("--max_stage_mib" in e.details(), e.details())
    w.healthy("a model that cannot fit")
    w.stop()


def case_unresolvable_collective_host():
    """A replica told a collective_host that does not resolve: refused in-band, naming it
    (Gloo resolved it itself and crashed), and the worker goes on serving."""
    w = Worker("badhost")
    w.configure(job("GREEDY"))
    j = job("GREEDY")
    j.replicas = 2
    try:
        w.configure(j, replica=1, rendezvous="127.0.0.1:1", rendezvous_group="g",
                    collective_host="no-such-host.invalid")
        check(False, "an unresolvable collective_host is refused")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.INVALID_ARGUMENT, f"INVALID_ARGUMENT, got {e.code()}")
        check("collective_host: 'no-such-host.invalid' does not resolve" in e.details(),
              e.details())
    w.healthy("an unresolvable collective_host")
    w.stop()


def case_memory_is_bounded_by_the_job():
    w = Worker("memory")
    w.configure(job("GREEDY"))
    rows = 4_000_000  # 96 MB of activations for a job whose batches are 8 rows
    big = batch(1, rows=rows, values=[0.0] * (rows * 6), labels=[0] * rows)
    errors = errors_of(w.exchange([big]))
    check(any("exceed" in e.message for e in errors), f"an oversized item is refused: {errors}")
    expect_refused(w, [batch(1, rows=20, batch_rows=20)], "batch_rows", "more rows than batch_size")
    w.healthy("oversized items")
    w.stop()


def case_message_cap_refuses_before_receiving():
    w = Worker("message_cap", "--max_message_mib=4")
    w.configure(job("GREEDY"))
    rows = 400_000  # a 9.6 MB message for a 4 MiB cap
    big = batch(1, rows=rows, values=[0.0] * (rows * 6), labels=[0] * rows)
    try:
        w.exchange([big])
        check(False, "a message over --max_message_mib ends the call")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, f"RESOURCE_EXHAUSTED, got {e.code()}")
    w.healthy("a message over the cap")
    w.stop()


def case_oversized_messages_are_bounded():
    """A 512 MiB message to a worker that takes 32 MiB, from a stranger without the token:
    gRPC reads a whole message before checking its size or any handler its token, and a
    1 GiB one took a worker from 194 MB to a 1.24 GB peak with 1 GB still resident minutes
    later. Now the server's memory quota (twice the cap plus 64 MiB) resets the stream, and
    the idle worker hands the memory back within seconds (to within 80 MiB of the start:
    gRPC's own buffers and the allocator's fragments stay)."""
    token_file = os.path.join(WORK, "oversized_token")
    open(token_file, "w").write("s3cret\n")
    w = Worker("oversized", "--max_message_mib=32", "--auth_token_file=" + token_file)
    good = [("authorization", "Bearer s3cret")]
    w.configure(job("GREEDY"), metadata=good)

    def status():
        v = {}
        for line in open(f"/proc/{w.proc.pid}/status"):
            if line.startswith(("VmHWM:", "VmRSS:")):
                v[line.split(":")[0]] = int(line.split()[1]) * 1024
        return v

    before = status()
    quota = 2 * (32 << 20) + (64 << 20)
    payload = b"\x0a" * (512 << 20)
    for label, md in (("without a token", None), ("with a wrong token", [("authorization", "Bearer x")])):
        # A connection of its own each time: while it stays open the transport may keep what
        # it buffered for it (within the quota); once the stranger leaves, it goes.
        channel = grpc.insecure_channel(w.address, options=[("grpc.max_send_message_length", -1)])
        raw = channel.unary_unary("/localpar.v1.Worker/Configure")  # bytes in, bytes out
        try:
            raw(payload, timeout=60, metadata=md)
            check(False, f"a 512 MiB message {label} is refused")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED,
                  f"512 MiB {label}: RESOURCE_EXHAUSTED, got {e.code()} {e.details()}")
        channel.close()
        if SANITIZED:
            continue  # ASan's shadow memory and quarantine: its figures say nothing of ours
        # The quota resets the stream once it is passed, but on a loaded machine gRPC has
        # read further by then (224 MiB was seen with the cluster tests beside it): the bound
        # is the quota plus 128 MiB, still well under the 512 MiB sent.
        peak = status()["VmHWM"] - before["VmRSS"]
        check(peak < quota + (128 << 20),
              f"512 MiB {label}: the peak grew by {peak >> 20} MiB, under the quota "
              f"{quota >> 20} MiB plus 128")
        deadline = time.time() + 10
        while time.time() < deadline and status()["VmRSS"] > before["VmRSS"] + (80 << 20):
            time.sleep(0.2)
        after = status()["VmRSS"] - before["VmRSS"]
        check(after < (80 << 20), f"512 MiB {label}: resident {after >> 20} MiB above the "
                                  "start within 10 s (about 190 MiB stayed without the trim)")
    del payload
    w.healthy("oversized messages", metadata=good)
    w.stop()


def case_metrics_take_many_clients_and_serve_only_metrics():
    w = Worker("metrics")
    idle = []
    for _ in range(20):  # slowloris: connect and say nothing
        s = socket.create_connection(("127.0.0.1", w.metrics_port))
        s.send(b"GET /met")
        idle.append(s)
    start = time.time()
    with socket.create_connection(("127.0.0.1", w.metrics_port), timeout=5) as s:
        s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        reply = s.recv(65536)
    check(time.time() - start < 2 and b"200 OK" in reply,
          f"a scrape beside 20 idle connections answers at once ({time.time() - start:.2f} s)")
    for s in idle:
        s.close()
    for path in ("/metricsXYZ", "/metrics/../../etc/passwd", "/"):
        with socket.create_connection(("127.0.0.1", w.metrics_port), timeout=5) as s:
            s.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
            check(b"404" in s.recv(4096).split(b"\r\n")[0], f"{path} is not found")
    w.configure(job("GREEDY"))
    w.healthy("metrics clients")
    w.stop()


def case_access_control():
    token_file = os.path.join(WORK, "token")
    open(token_file, "w").write("s3cret\n")
    w = Worker("tokens", "--auth_token_file=" + token_file)

    def set_initial(md):  # past the token check, a stage not waiting for parameters says so
        try:
            w.stub.SetInitial(iter([]), timeout=5, metadata=md)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.FAILED_PRECONDITION:
                raise

    calls = {
        "Configure": lambda md: w.configure(job("GREEDY"), metadata=md),
        "Stats": lambda md: w.stats(md),
        "GetWeights": lambda md: w.stub.GetWeights(localpar_pb2.WeightsRequest(), timeout=5,
                                                    metadata=md),
        "StreamWeights": lambda md: list(w.stub.StreamWeights(localpar_pb2.WeightsRequest(),
                                                              timeout=5, metadata=md)),
        "SetInitial": set_initial,
        "Stream": lambda md: w.exchange([control(1, localpar_pb2.Control.DRAIN)], md),
    }
    for name, call in calls.items():
        for md, label in ((None, "no token"), ([("authorization", "Bearer wrong")], "a wrong token")):
            try:
                call(md)
                check(False, f"{name} with {label} is refused")
            except grpc.RpcError as e:
                check(e.code() == grpc.StatusCode.UNAUTHENTICATED, f"{name}, {label}: {e.code()}")
        try:
            call([("authorization", "Bearer s3cret")])
        except grpc.RpcError as e:
            check(False, f"{name} with the right token: {e.code()} {e.details()}")
    from proto import health_pb2, health_pb2_grpc  # noqa: E402 (the standard health service)
    health = health_pb2_grpc.HealthStub(w.channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    check(health.status == health_pb2.HealthCheckResponse.SERVING, "health answers without a token")
    try:
        w.stub.Shutdown(localpar_pb2.ShutdownRequest(), timeout=5)
        check(False, "Shutdown without a token is refused")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.UNAUTHENTICATED, f"Shutdown: {e.code()}")
    w.healthy("tokens", metadata=[("authorization", "Bearer s3cret")])
    w.stub.Shutdown(localpar_pb2.ShutdownRequest(), timeout=5,
                    metadata=[("authorization", "Bearer s3cret")])
    check(w.proc.wait(timeout=15) == 0, "Shutdown with the token stops the worker")


# ---- gradients and replies from downstream ------------------------------------------------

class FakeDownstream:
    """The next stage, played by us: answers every batch with `reply(batch)` items."""

    def __init__(self, reply, end=None):
        self.reply, self.end = reply, end
        self.server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4))
        handler = grpc.method_handlers_generic_handler("localpar.v1.Worker", {
            "Stream": grpc.stream_stream_rpc_method_handler(
                self.stream, request_deserializer=localpar_pb2.DownItem.FromString,
                response_serializer=lambda m: m.SerializeToString())})
        self.server.add_generic_rpc_handlers((handler,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def stream(self, requests, context):
        for item in requests:
            if item.HasField("batch"):
                for up in self.reply(item.batch):
                    yield up
            elif item.control.kind in (localpar_pb2.Control.DRAIN, localpar_pb2.Control.SHUTDOWN):
                yield localpar_pb2.UpItem(ack=localpar_pb2.Ack(seq=item.control.seq,
                                                               kind=item.control.kind))
            if self.end and self.end(item, context):
                return


def gradient(b, shape=None, data=None, seq=None):
    shape = shape if shape is not None else [b.activations.shape[0], 6]
    data = data if data is not None else floats([0.01] * int(math.prod(shape)))
    return localpar_pb2.UpItem(gradient=localpar_pb2.Gradient(
        seq=b.seq if seq is None else seq, step=b.step,
        grad=tensor(tensor_pb2.F32, shape, data)))


def overlap_worker(name, reply, end=None):
    down = FakeDownstream(reply, end)
    w = Worker(name)
    w.configure(job("OVERLAP"), stage=0, downstream=f"127.0.0.1:{down.port}")
    return w, down


def weights_finite(w):
    for p in w.stub.GetWeights(localpar_pb2.WeightsRequest(), timeout=10).params:
        values = struct.unpack(f"<{len(p.tensor.data) // 4}f", p.tensor.data)
        if not all(math.isfinite(v) for v in values):
            return False
    return True


def case_bad_gradients():
    bad = {
        "a short buffer": lambda b: [gradient(b, data=b"\0" * 7)],
        "NaN": lambda b: [gradient(b, data=floats([float("nan")] * (b.activations.shape[0] * 6)))],
        "a huge claimed shape": lambda b: [gradient(b, shape=[1 << 40, 6], data=b"")],
        "another batch's seq": lambda b: [gradient(b, seq=b.seq + 100)],
    }
    for what, reply in bad.items():
        w, down = overlap_worker("grad_" + what.replace(" ", "_").replace("'", ""), reply)
        up = w.exchange([batch(1), batch(2, step=1), control(3, localpar_pb2.Control.DRAIN)])
        errors = errors_of(up)
        check(any("from stage 1" in e.message for e in errors),
              f"{what}: refused and reported ({[e.message for e in errors]})")
        check(any(u.HasField("ack") for u in up), f"{what}: the stream went on")
        check(w.proc.poll() is None and weights_finite(w), f"{what}: alive, weights finite")
        w.stop()
        down.server.stop(0)


def case_unwanted_gradients_cannot_wedge_a_stage():
    """A downstream answering one batch with 300 gradients (more than the 256-slot gradient
    queue): GREEDY wants none, OVERLAP exactly one per batch. Either way the rest are refused
    in-band, the DRAIN is acknowledged, the stream ends, and the stage takes a new stream and
    a new Configure."""
    for rule in ("GREEDY", "OVERLAP"):
        down = FakeDownstream(lambda b: [gradient(b) for _ in range(300)])
        w = Worker("wedge_" + rule)
        w.configure(job(rule), stage=0, downstream=f"127.0.0.1:{down.port}")
        up = w.exchange([batch(1), control(2, localpar_pb2.Control.DRAIN)], timeout=15)
        check(any(u.HasField("ack") for u in up),
              f"{rule}: acks still flow after 300 unwanted gradients")
        w.configure(job("GREEDY"))
        w.healthy(f"{rule}: after 300 unwanted gradients")
        start = time.time()
        check(w.stop() == 128 + signal.SIGTERM and time.time() - start < 10,
              f"{rule}: SIGTERM stops it")
        down.server.stop(0)


def case_forged_errors_are_sanitised():
    forged = "\x1b[31mowned\x1b[0m" + "x" * 1_000_000
    reply = lambda b: [localpar_pb2.UpItem(error=localpar_pb2.ItemError(  # noqa: E731
        seq=b.seq, stage=1, code=3, message=forged))]
    w, down = overlap_worker("forged", reply)
    errors = errors_of(w.exchange([batch(1), control(2, localpar_pb2.Control.DRAIN)]))
    relayed = [e.message for e in errors if "owned" in e.message]
    check(relayed and "\x1b" not in relayed[0] and len(relayed[0]) < 1000,
          f"a forged error is relayed without escapes and cut short ({len(relayed[0]) if relayed else None})")
    w.stop()
    down.server.stop(0)


def case_lost_downstream_is_unavailable():
    def end(item, context):
        if item.HasField("batch"):
            context.abort(grpc.StatusCode.INTERNAL, "gone")
        return False
    w, down = overlap_worker("lost", lambda b: [], end)
    try:
        w.exchange([batch(1), batch(2, step=1), control(3, localpar_pb2.Control.DRAIN)], timeout=15)
        check(False, "a lost downstream ends the stream")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.UNAVAILABLE and "stage 1" in e.details(),
              f"UNAVAILABLE naming the stage, got {e.code()} {e.details()}")
    check(w.proc.poll() is None, "the worker outlives its downstream")
    w.stop()
    down.server.stop(0)


def case_upstream_that_stops_reading():
    w = Worker("stall", "--upstream_stall_s=2")
    wide = text_format.Parse("""
        rule: OVERLAP batch_size: 64 epochs: 1
        data { synthetic { shape: [16] classes: 3 } }
        stages { layers { linear { out_features: 4096 } } }
        stages { layers { linear { out_features: 4 } } }
    """, job_pb2.Job())
    w.configure(wide, stage=1)  # the last stage returns a 1 MiB gradient per batch
    items = (batch(i + 1, rows=64, features=4096, step=i, values=[0.1] * (64 * 4096),
                   labels=[1] * 64) for i in range(100))
    call = w.stub.Stream(items, timeout=120)  # never read
    end = time.time() + 30
    while time.time() < end and "upstream read nothing" not in open(w.dir + "/log").read():
        time.sleep(0.2)
    check("upstream read nothing for 2 s" in open(os.path.join(w.dir, "log")).read(),
          "a stream whose peer stopped reading is ended")
    start = time.time()
    threads = []
    for _ in range(100):
        t = threading.Thread(target=lambda: w.stub.GetWeights(localpar_pb2.WeightsRequest()))
        t.start()
        threads.append(t)
    for t in threads:
        t.join(timeout=30)
    check(time.time() - start < 30, "100 calls without a deadline all return")
    threads_now = len(os.listdir(f"/proc/{w.proc.pid}/task"))
    check(threads_now < 100, f"server threads stay bounded ({threads_now})")
    call.cancel()
    w.configure(job("GREEDY"))
    w.healthy("an upstream that stopped reading")
    w.stop()


# ---- replicas and their collective ------------------------------------------------------

class Rendezvous(localpar_pb2_grpc.RendezvousServicer):
    """The coordinator's Rendezvous service, written here from proto/ alone: a key-value store
    whose Get waits for every key."""

    def __init__(self, on_set=None):
        """on_set(key, value), if given, runs before a value is stored and returns the value
        to store: the test's hook for acting while a replica joins, or for lying to it."""
        self.on_set = on_set
        self.values, self.cv = {}, threading.Condition()
        self.server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=16))
        localpar_pb2_grpc.add_RendezvousServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.address = f"127.0.0.1:{self.port}"

    def Set(self, request, context):
        value = self.on_set(request.key, request.value) if self.on_set else request.value
        with self.cv:
            self.values[request.key] = value
            self.cv.notify_all()
        return localpar_pb2.StoreSetResponse()

    def Get(self, request, context):
        end = time.time() + request.timeout_ms / 1000.0
        with self.cv:
            while not all(k in self.values for k in request.keys):
                if time.time() > end or not self.cv.wait(timeout=max(0.0, end - time.time())):
                    if not all(k in self.values for k in request.keys):
                        context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "missing keys")
            return localpar_pb2.StoreGetResponse(values=[self.values[k] for k in request.keys])

    def stop(self):
        self.server.stop(0)


def replica_pair(name, jobs, group, initial=(None, None), on_set=None, timeout_s=20):
    """Two workers configured as replicas 0 and 1 of stage 1, from jobs[0] and jobs[1]."""
    rv = Rendezvous(on_set)
    workers = []
    for r, j in enumerate(jobs):
        j = localpar_pb2.ConfigureRequest(job=j).job  # a copy
        j.replicas = 2
        w = Worker(f"{name}{r}")
        extra = {"initial": initial[r]} if initial[r] is not None else {}
        w.configure(j, replica=r, rendezvous=rv.address, rendezvous_group=group,
                    collective_host="127.0.0.1", rendezvous_timeout_s=timeout_s, **extra)
        workers.append(w)
    return rv, workers


def exchange_both(workers, batches):
    """Each worker's items at once (their exchange waits for the other); what came back."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(workers)) as pool:
        futures = [pool.submit(w.exchange, items, None, 60) for w, items in zip(workers, batches)]
        out = []
        for f in futures:
            try:
                out.append(f.result())
            except grpc.RpcError as e:
                out.append(e)
        return out


def replica_batches():
    # A step of 2 rows: one for each replica.
    return [[batch(1, rows=1, batch_rows=2), control(2, localpar_pb2.Control.DRAIN)]
            for r in range(2)]


def expect_replicas_refuse(workers, text, what, after=None):
    """One step on both replicas: each refuses it in-band with `text`, stays alive, runs
    after(r, worker) if given, and trains again once reconfigured without replicas."""
    results = exchange_both(workers, replica_batches())
    for r, (w, up) in enumerate(zip(workers, results)):
        check(w.proc.poll() is None, f"{what}: replica {r} is alive")
        messages = [e.message for e in errors_of(up)] if isinstance(up, list) else [str(up)]
        check(any(text in m for m in messages), f"{what}: replica {r} says '{text}': {messages}")
        if after:
            after(r, w)
        w.configure(job("GREEDY"))
        w.healthy(f"replica {r} after {what}")
        w.stop()


def case_replica_bucket_mismatch():
    """Replicas of one stage configured from jobs whose stage differs (out_features 4 and 8):
    Gloo aborted the replica with the smaller bucket. Now they compare what they run at the
    rendezvous and both refuse in-band, naming the replica, and go on serving."""
    other = job("GREEDY")
    other.stages[1].layers[0].linear.out_features = 8
    rv, workers = replica_pair("mismatch", [job("GREEDY"), other], "mismatch")
    expect_replicas_refuse(workers, "runs another job or stage than replica", "a bucket mismatch")
    rv.stop()


def case_replica_non_finite_bucket():
    """A replica with a NaN weight (configured so), whose gradients are then NaN: its peer
    used to step into NaN weights. Both see the gathered buckets and refuse the step naming
    replica 1; replica 0 keeps its finite weights."""
    probe = Worker("nanprobe")
    probe.configure(job("GREEDY"))
    nan = probe.stub.GetWeights(localpar_pb2.WeightsRequest(), timeout=10)
    probe.stop()
    values = list(struct.unpack(f"<{len(nan.params[0].tensor.data) // 4}f",
                                nan.params[0].tensor.data))
    values[0] = float("nan")
    nan.params[0].tensor.data = floats(values)
    rv, workers = replica_pair("nanbucket", [job("GREEDY"), job("GREEDY")], "nan",
                               initial=(None, nan))
    before = [w.stub.GetWeights(localpar_pb2.WeightsRequest(), timeout=10) for w in workers]

    def unchanged(r, w):
        after = w.stub.GetWeights(localpar_pb2.WeightsRequest(), timeout=10)
        if r == 0:
            check(weights_finite(w), "replica 0 keeps finite weights")
        check(after == before[r], f"replica {r} took no step")

    expect_replicas_refuse(workers, "replica 1 of stage 1 sent a gradient bucket with",
                           "a non-finite bucket", unchanged)
    rv.stop()


def case_strangers_on_the_collective_port():
    """While replica 0 waits for replica 1 to join, strangers connect to its collective port:
    one sends a Gloo preamble with an unknown slot (48 bytes, which aborted a Gloo worker 0.6 s
    later), one a hello without the secret, one nothing. The mesh closes all three, the
    replicas join and train the step together, and afterwards the port takes no one."""
    strangers, where = [], []
    gloo_preamble = struct.pack("<6Q", 48, 1, 0xdeadbeef, 0, 48, 0)

    def on_set(key, value):
        if key.endswith("/mesh-0"):
            host, port, _ = value.decode().split(" ")
            where.append((host, int(port)))
            for payload in (gloo_preamble, b"LPMESH01" + bytes(56), b""):
                c = socket.create_connection((host, int(port)), timeout=5)
                c.sendall(payload)
                strangers.append(c)
        return value

    rv, workers = replica_pair("strangers", [job("GREEDY"), job("GREEDY")], "strangers",
                               on_set=on_set)
    results = exchange_both(workers, replica_batches())
    for r, (w, up) in enumerate(zip(workers, results)):
        check(w.proc.poll() is None, f"strangers: replica {r} is alive")
        check(isinstance(up, list) and not errors_of(up) and any(u.HasField("ack") for u in up),
              f"strangers: replica {r} trained the step: {up if not isinstance(up, list) else errors_of(up)}")
    check(len(strangers) == 3, "three strangers connected while replica 0 was joining")
    for c in strangers:
        try:
            check(c.recv(1) == b"", "a stranger's connection is closed")
        except OSError:
            pass  # reset: closed too
        c.close()
    refused = False
    try:
        socket.create_connection(where[0], timeout=2).close()
    except OSError:
        refused = True
    check(refused, "once joined, the collective port refuses connections")
    log = open(os.path.join(workers[0].dir, "log")).read()
    check("closed 3 connection(s) to its collective port" in log, "replica 0 logs the strangers")
    weights = [w.stub.GetWeights(localpar_pb2.WeightsRequest(), timeout=10) for w in workers]
    check(weights[0] == weights[1], "both replicas took the same step")
    for r, w in enumerate(workers):
        w.configure(job("GREEDY"))
        w.healthy(f"replica {r} after strangers")
        w.stop()
    rv.stop()


def case_fake_replica_address():
    """The rendezvous names an impostor as replica 0: a server that answers the hello with the
    wrong secret. Replica 1 never takes it for a replica; both refuse the step in-band naming
    what happened, and go on serving."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    fake_port = server.getsockname()[1]

    def impostor():
        while True:
            try:
                c, _ = server.accept()
            except OSError:
                return
            c.recv(64)
            c.sendall(b"LPMESHOK" + struct.pack("<4I", 0, 1, 2, 0) + b"z" * 32 + bytes(8))
            c.close()

    threading.Thread(target=impostor, daemon=True).start()

    def on_set(key, value):
        if key.endswith("/mesh-0"):
            return f"127.0.0.1 {fake_port} {'ab' * 32}".encode()
        return value

    rv, workers = replica_pair("impostor", [job("GREEDY"), job("GREEDY")], "impostor",
                               on_set=on_set, timeout_s=3)
    results = exchange_both(workers, replica_batches())
    texts = ["replica(s) 1 of stage 1 did not connect to replica 0 within 3 s",
             "answered the hello, but not as replica 0 of this configuration"]
    for r, (w, up) in enumerate(zip(workers, results)):
        check(w.proc.poll() is None, f"impostor: replica {r} is alive")
        messages = [e.message for e in errors_of(up)] if isinstance(up, list) else [str(up)]
        check(any(texts[r] in m for m in messages), f"impostor: replica {r} says '{texts[r]}': {messages}")
        w.configure(job("GREEDY"))
        w.healthy(f"replica {r} after an impostor")
        w.stop()
    server.close()
    rv.stop()


def case_weights_in_pieces():
    """SetInitial and StreamWeights: every piece is checked before it is copied in (a name the
    stage does not have, another shape, a gap, data past the tensor, a stream that ends
    early), and until every parameter has arrived whole the stage refuses to train; then
    the pieces set exactly what was sent, and StreamWeights gives it back in pieces."""
    w = Worker("pieces")
    w.configure(job("GREEDY"), initial_follows=True)
    try:
        w.exchange([batch(1), control(2, localpar_pb2.Control.DRAIN)])
        check(False, "a stage waiting for its parameters refuses a Stream")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.FAILED_PRECONDITION and "SetInitial" in e.details(),
              f"Stream before SetInitial: {e.code()} {e.details()}")
    pieces = list(w.stub.StreamWeights(localpar_pb2.WeightsRequest(chunk_bytes=8), timeout=10))
    check(all(len(p.data) <= 8 for p in pieces) and len(pieces) > 4,
          f"StreamWeights in pieces of 8 bytes: {len(pieces)} pieces")
    shapes = {}
    for p in pieces:
        shapes.setdefault(p.name, list(p.shape))
    sizes = {n: 4 * __import__("math").prod(s) for n, s in shapes.items()}

    def chunks(value=0.5, step=12, names=None):
        for name in names or shapes:
            data = floats([value] * (sizes[name] // 4))
            for at in range(0, len(data), step):
                yield localpar_pb2.ParamChunk(name=name, shape=shapes[name], offset=at // 4,
                                              data=data[at:at + step])

    first = next(iter(shapes))
    bad = [
        ([localpar_pb2.ParamChunk(name="../../etc/passwd", shape=[1], data=floats([1]))],
         "has no parameter"),
        ([localpar_pb2.ParamChunk(name=first, shape=[7, 7], data=floats([1]))], "ParamChunk.shape"),
        ([localpar_pb2.ParamChunk(name=first, shape=shapes[first], offset=1, data=floats([1]))],
         "ParamChunk.offset"),
        ([localpar_pb2.ParamChunk(name=first, shape=shapes[first],
                                  data=floats([1] * (sizes[first] // 4 + 1)))], "do not fit"),
        ([localpar_pb2.ParamChunk(name=first, shape=shapes[first], data=b"abc")], "do not fit"),
        (list(chunks(names=[first])), "stays unstarted"),
    ]
    for items, text in bad:
        try:
            w.stub.SetInitial(iter(items), timeout=10)
            check(False, f"SetInitial refuses pieces naming '{text}'")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and text in e.details(),
                  f"SetInitial: {text}: got {e.code()} {e.details()}")
    check(w.proc.poll() is None, "the worker is alive after bad pieces")
    resp = w.stub.SetInitial(chunks(), timeout=10)
    check(resp.params == len(shapes) and resp.bytes == sum(sizes.values()),
          f"SetInitial set {resp.params} parameters, {resp.bytes} bytes")
    got = w.stub.GetWeights(localpar_pb2.WeightsRequest(), timeout=10)
    check(all(t.tensor.data == floats([0.5] * (sizes[t.name] // 4)) for t in got.params),
          "the pieces set exactly the values sent")
    try:
        w.stub.SetInitial(chunks(), timeout=10)
        check(False, "a second SetInitial is refused")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.FAILED_PRECONDITION, f"second SetInitial: {e.code()}")
    for size in (-1, 1 << 30):
        try:
            list(w.stub.StreamWeights(localpar_pb2.WeightsRequest(chunk_bytes=size), timeout=10))
            check(False, f"chunk_bytes {size} is refused")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and "chunk_bytes" in e.details(),
                  f"chunk_bytes {size}: {e.code()} {e.details()}")
    w.healthy("weights in pieces")
    w.stop()


def case_stalled_set_initial():
    """A SetInitial that sends one piece and then nothing ends after the worker's bound on
    silence (--upstream_stall_s) with an error that says so, and a Configure waiting behind
    it succeeds within that bound plus 5 s: a peer cannot hold the stage."""
    bound = 2
    w = Worker("stalled_initial", f"--upstream_stall_s={bound}")
    w.configure(job("GREEDY"), initial_follows=True)
    pieces = list(w.stub.StreamWeights(localpar_pb2.WeightsRequest(chunk_bytes=8), timeout=10))
    release = threading.Event()

    def one_then_nothing():
        yield pieces[0]
        release.wait(60)

    outcome = {}

    def send():
        try:
            w.stub.SetInitial(one_then_nothing(), timeout=60)
            outcome["code"] = grpc.StatusCode.OK
        except grpc.RpcError as e:
            outcome["code"], outcome["details"] = e.code(), e.details()

    sender = threading.Thread(target=send)
    sender.start()
    time.sleep(0.5)  # the stalled stream holds the stage now
    start = time.time()
    try:
        w.configure(job("GREEDY"))
        took = time.time() - start
        check(took < bound + 5, f"Configure behind a stalled SetInitial took {took:.1f} s "
                                f"(bound {bound} s + 5 s)")
    except grpc.RpcError as e:
        check(False, f"Configure behind a stalled SetInitial: {e.code()} {e.details()}")
    sender.join(timeout=10)
    release.set()
    # Cancelling is what unblocks the worker's read, so the client sees CANCELLED; the
    # worker's log says why.
    check(outcome.get("code") == grpc.StatusCode.CANCELLED,
          f"the stalled SetInitial was ended: {outcome}")
    w.log.flush()
    check("no piece came for 2 s" in open(os.path.join(w.dir, "log")).read(),
          "the worker's log names the silence")
    w.healthy("stalled SetInitial")
    w.stop()


CASES = [case_weights_in_pieces, case_stalled_set_initial, case_strangers_on_the_collective_port, case_fake_replica_address,
         case_replica_bucket_mismatch, case_replica_non_finite_bucket,
         case_unresolvable_collective_host, case_integers_out_of_range, case_async_negative_step, case_no_path_from_the_wire,
         case_failed_configure_keeps_the_stage, case_memory_is_bounded_by_the_job,
         case_message_cap_refuses_before_receiving, case_oversized_messages_are_bounded,
         case_metrics_take_many_clients_and_serve_only_metrics, case_access_control,
         case_bad_gradients, case_unwanted_gradients_cannot_wedge_a_stage,
         case_forged_errors_are_sanitised, case_lost_downstream_is_unavailable,
         case_upstream_that_stops_reading]

ONLY = os.environ.get("HOSTILE_CASES", "")  # a comma-separated subset, for development
try:
    for case in CASES:
        if ONLY and case.__name__ not in ONLY.split(","):
            continue
        print(f"hostile_peer: {case.__name__}", flush=True)
        try:
            case()
        except Exception as e:  # a crash of ours, or a dead worker
            check(False, f"{case.__name__}: {type(e).__name__}: {e}")
finally:
    for p in PROCESSES:
        if p.poll() is None:
            p.kill()
            p.wait()
    if not FAILURES:
        shutil.rmtree(WORK, ignore_errors=True)
if FAILURES:
    print(f"hostile_peer: {len(FAILURES)} failure(s); logs in {WORK}")
    sys.exit(1)
print("hostile_peer: ok")
