#!/usr/bin/python3
"""The coordinator against a worker that lies about its weights, and workers against a
coordinator that dies.

Weights: two real workers train a small job; the second is reached through a proxy written
from proto/ alone (Debian's protoc and python3-grpcio) that passes every call through but
answers StreamWeights itself: a tensor declared [2^38] and fed 4 MiB pieces without end,
every tensor one element short, an extra tensor, NaN values, a stream that sends nothing.
The coordinator must exit non-zero naming the stage and the tensor, write no weights, and
stay within its normal collection's peak memory plus 64 MiB. Through the same proxy left
honest, the run ends 0 with its weights.

Peer loss: a 4-stage cluster whose coordinator is SIGKILLed at a random moment, then the
workers stopped as the launcher stops them (SIGTERM): no worker may die of a signal (it
used to abort in its stream session's end: a downstream call used after it was gone).

usage: untrusted_worker_test.py BUILD_DIR SOURCE_DIR [KILL_RUNS]
"""

import concurrent.futures
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

BUILD, SOURCE = sys.argv[1], sys.argv[2]
KILL_RUNS = int(sys.argv[3]) if len(sys.argv) > 3 else 20
WORK = tempfile.mkdtemp(prefix="localpar_untrusted.")
GEN = os.path.join(WORK, "gen")
os.makedirs(GEN)
protos = [os.path.join("proto", p) for p in sorted(os.listdir(os.path.join(SOURCE, "proto")))
          if p.endswith(".proto")]
subprocess.run(["protoc", "-I", SOURCE, "-I", "/usr/include", "--python_out", GEN,
                "--grpc_python_out", GEN, "--plugin=protoc-gen-grpc_python=" +
                shutil.which("grpc_python_plugin")] + protos, check=True, cwd=SOURCE)
sys.path.insert(0, GEN)

import grpc  # noqa: E402
from proto import localpar_pb2  # noqa: E402

FAILURES = []
PROCESSES = []
SANITIZED = os.environ.get("LOCALPAR_SANITIZED") == "1"  # ASan's memory is not the program's
SERVICE = "/localpar.v1.Worker/"


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print(f"  FAIL: {what}", flush=True)


JOB = """
name: "untrusted" rule: GREEDY batch_size: 16 epochs: 1 seed: 3
data { synthetic { shape: [12] classes: 3 train_examples: 256 test_examples: 64 } }
stages { layers { linear { out_features: 16 } } layers { relu {} } }
stages { layers { linear { out_features: 8 } } }
"""

DEEP_JOB = """
name: "deep" rule: GREEDY batch_size: 32 epochs: 50 seed: 5
data { synthetic { shape: [64] classes: 4 train_examples: 4096 test_examples: 64 } }
stages { layers { linear { out_features: 64 } } }
stages { layers { linear { out_features: 64 } } }
stages { layers { linear { out_features: 64 } } }
stages { layers { linear { out_features: 64 } } }
"""


def wait_port_file(path, timeout=15):
    end = time.time() + timeout
    while time.time() < end:
        try:
            ports = [int(p) for p in open(path).read().split()]
            if ports and ports[0] > 0:
                return ports[0]
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    raise RuntimeError(f"{path}: no port")


def start_worker(name, *flags):
    d = os.path.join(WORK, name)
    os.makedirs(d, exist_ok=True)
    log = open(os.path.join(d, "log"), "w")
    proc = subprocess.Popen([os.path.join(BUILD, "localpar_worker"), "--port_file=" + d + "/port",
                             "--metrics_listen="] + list(flags),
                            stdout=log, stderr=subprocess.STDOUT)
    PROCESSES.append(proc)
    return proc, f"127.0.0.1:{wait_port_file(d + '/port')}", os.path.join(d, "log")


def floats(values):
    return struct.pack(f"<{len(values)}f", *values)


class Proxy:
    """Every Worker call passed through to `target` as raw bytes, except StreamWeights,
    answered by `lie(honest_pieces)` when one is set."""

    def __init__(self, target):
        self.channel = grpc.insecure_channel(target, options=[
            ("grpc.max_receive_message_length", 1 << 30),
            ("grpc.max_send_message_length", 1 << 30)])
        self.lie = None
        self.server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=16),
                                  options=[("grpc.max_receive_message_length", 1 << 30),
                                           ("grpc.max_send_message_length", 1 << 30)])
        self.server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "localpar.v1.Worker", {
                "Configure": self.unary("Configure"),
                "Stats": self.unary("Stats"),
                "GetWeights": self.unary("GetWeights"),
                "Shutdown": self.unary("Shutdown"),
                "SetInitial": grpc.stream_unary_rpc_method_handler(self.set_initial),
                "Stream": grpc.stream_stream_rpc_method_handler(self.stream),
                "StreamWeights": grpc.unary_stream_rpc_method_handler(self.weights),
            })])
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"
        self.server.start()

    def unary(self, method):
        call = self.channel.unary_unary(SERVICE + method)

        def handler(request, context):
            return call(request, metadata=context.invocation_metadata())
        return grpc.unary_unary_rpc_method_handler(handler)

    def set_initial(self, requests, context):
        return self.channel.stream_unary(SERVICE + "SetInitial")(
            requests, metadata=context.invocation_metadata())

    def stream(self, requests, context):
        call = self.channel.stream_stream(SERVICE + "Stream")(
            requests, metadata=context.invocation_metadata())
        context.add_callback(call.cancel)
        yield from call

    def weights(self, request, context):
        honest = self.channel.unary_stream(
            SERVICE + "StreamWeights", response_deserializer=localpar_pb2.ParamChunk.FromString)
        pieces = list(honest(request, metadata=context.invocation_metadata()))
        out = self.lie(pieces) if self.lie else pieces
        for p in out:
            if not context.is_active():
                return
            yield p.SerializeToString()


def endless(pieces):
    first = pieces[0]
    piece = b"\0" * (4 << 20)
    at = 0
    while True:
        yield localpar_pb2.ParamChunk(name=first.name, shape=[1 << 38], offset=at // 4, data=piece)
        at += len(piece)


def whole(pieces):
    """{name: (shape, bytes)} in order, from the honest pieces."""
    tensors = {}
    for p in pieces:
        shape, data = tensors.get(p.name, (list(p.shape), b""))
        tensors[p.name] = (shape, data + p.data)
    return tensors


def one_short(pieces):
    for name, (shape, data) in whole(pieces).items():
        shape = shape[:-1] + [shape[-1] - 1] if shape[-1] > 1 else shape[:-2] + [shape[-2] - 1, 1]
        n = 1
        for d in shape:
            n *= d
        yield localpar_pb2.ParamChunk(name=name, shape=shape, offset=0, data=data[:4 * n])


def extra(pieces):
    yield from pieces
    yield localpar_pb2.ParamChunk(name="99.weight", shape=[2], offset=0, data=floats([1, 2]))


def not_finite(pieces):
    for p in pieces:
        count = len(p.data) // 4
        yield localpar_pb2.ParamChunk(name=p.name, shape=p.shape, offset=p.offset,
                                      data=floats([float("nan")] * count))


def silent(pieces):
    time.sleep(120)
    return iter(())


def run_coordinator(addresses, out, *flags):
    job = os.path.join(WORK, "job.textproto")
    with open(job, "w") as f:
        f.write(JOB)
    start = time.time()
    proc = subprocess.Popen([os.path.join(BUILD, "localpar_coordinator"), "--job=" + job,
                             "--workers=" + ",".join(addresses), "--out=" + out, "--quiet",
                             "--metrics_listen=", "--status_listen="] + list(flags),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    PROCESSES.append(proc)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    text = proc.stdout.read()
    return proc.returncode, text, usage.ru_maxrss * 1024, time.time() - start


def case_lying_weights():
    _, w0, _ = start_worker("w0", "--stay_after_shutdown")
    _, w1, _ = start_worker("w1", "--stay_after_shutdown")
    proxy = Proxy(w1)
    out = os.path.join(WORK, "honest")
    code, text, honest_peak, _ = run_coordinator([w0, proxy.address], out)
    check(code == 0 and os.path.exists(os.path.join(out, "weights.pb")),
          f"through an honest proxy the run ends 0 with weights.pb: exit {code}\n{text}")
    lies = [(endless, "0.weight is [274877906944]"), (one_short, "0.weight is ["),
            (extra, "has no tensor 99.weight"), (not_finite, "0.weight holds nan"),
            (silent, "sent nothing for 2 s")]
    for lie, text_wanted in lies:
        proxy.lie = lie
        out = os.path.join(WORK, lie.__name__)
        code, text, peak, took = run_coordinator([w0, proxy.address], out, "--collect_stall_s=2")
        print(f"  {lie.__name__}: exit {code} in {took:.1f} s, peak {peak >> 20} MiB "
              f"(honest {honest_peak >> 20} MiB)", flush=True)
        check(code not in (0, None) and code > 0, f"{lie.__name__}: exits non-zero: {code}")
        check("stage 1" in text and text_wanted in text,
              f"{lie.__name__}: names stage 1 and '{text_wanted}':\n{text}")
        check(not os.path.exists(os.path.join(out, "weights.pb"))
              and not os.path.exists(os.path.join(out, "weights")),
              f"{lie.__name__}: no weights written")
        check(SANITIZED or peak < honest_peak + (64 << 20),
              f"{lie.__name__}: peak {peak >> 20} MiB < honest {honest_peak >> 20} MiB + 64 MiB")
        check(took < 60, f"{lie.__name__}: ended in {took:.1f} s")
    proxy.server.stop(0)


def case_coordinator_killed():
    """The launcher's way: the coordinator dies, the workers get SIGTERM."""
    rng = random.Random(7)
    job = os.path.join(WORK, "deep.textproto")
    with open(job, "w") as f:
        f.write(DEEP_JOB)
    for run in range(KILL_RUNS):
        workers = [start_worker(f"kill{run}_{k}") for k in range(4)]
        coordinator = subprocess.Popen(
            [os.path.join(BUILD, "localpar_coordinator"), "--job=" + job, "--quiet",
             "--workers=" + ",".join(w[1] for w in workers), "--metrics_listen=",
             "--status_listen="], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        PROCESSES.append(coordinator)
        time.sleep(rng.uniform(0.3, 3.0))
        coordinator.kill()
        coordinator.wait()
        time.sleep(rng.uniform(0, 0.3))
        for proc, _, _ in workers:
            proc.send_signal(signal.SIGTERM)
        for k, (proc, _, log) in enumerate(workers):
            try:
                code = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = "hung"
            check(code in (0, 128 + signal.SIGTERM),
                  f"run {run}: worker {k} ended with {code} (a signal is a crash):\n"
                  + open(log).read()[-3000:])


try:
    for case in (case_lying_weights, case_coordinator_killed):
        print(f"untrusted_worker: {case.__name__}", flush=True)
        try:
            case()
        except Exception as e:
            check(False, f"{case.__name__}: {type(e).__name__}: {e}")
finally:
    for p in PROCESSES:
        if p.poll() is None:
            p.kill()
            p.wait()
    if not FAILURES:
        shutil.rmtree(WORK, ignore_errors=True)
if FAILURES:
    print(f"untrusted_worker: {len(FAILURES)} failure(s); logs in {WORK}")
    sys.exit(1)
print("untrusted_worker: ok")
