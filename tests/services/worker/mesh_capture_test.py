#!/usr/bin/python3
"""A replicated cluster captured on its loopback (as root): `localpar run` with 2 stages of
2 replicas runs in a network namespace of its own while a raw packet socket on that
namespace's loopback records every packet. In the clear the capture holds the replicas'
hello and bucket frames (so the check can fail); with --tls_cert --tls_key --tls_ca --mtls
it holds none of them, and the weights still equal `localpar train` bit for bit.

Usage: mesh_capture_test.py LOCALPAR_BINARY SOURCE_DIR
"""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

FAILURES = []
ETH_P_ALL = 0x0003


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print(f"  FAIL: {what}", flush=True)


def capture(out_path):
    """Inside the namespace: every packet on lo appended to out_path until SIGTERM."""
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.bind(("lo", 0))
    s.settimeout(0.1)
    with open(out_path + ".tmp", "wb") as out:
        open(out_path + ".ready", "w").close()
        while not stop:
            try:
                out.write(s.recv(1 << 16))
            except socket.timeout:
                pass
    os.rename(out_path + ".tmp", out_path)


def make_certs(d):
    script = """set -e
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:prime256v1 -out "$1" 2>/dev/null; }
key ca.key; openssl req -x509 -new -key ca.key -out ca.pem -days 2 -subj "/CN=capture CA"
printf "subjectAltName=IP:127.0.0.1,DNS:localhost\\n" > san.ext
key node.key; openssl req -new -key node.key -out node.csr -subj "/CN=localhost"
openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out node.pem -days 2 \\
  -extfile san.ext 2>/dev/null
"""
    subprocess.run(["bash", "-c", script], cwd=d, check=True, capture_output=True)


def captured_run(localpar, job, d, name, flags):
    """`localpar run` in a namespace of its own, captured; returns (exit code, output, bytes)."""
    ns = f"lpcap{os.getpid()}{name}"
    pcap = os.path.join(d, name + ".raw")
    subprocess.run(["ip", "netns", "add", ns], check=True)
    cap = None
    try:
        subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"], check=True)
        cap = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, __file__,
                                "--capture", pcap])
        for _ in range(100):
            if os.path.exists(pcap + ".ready"):
                break
            time.sleep(0.05)
        r = subprocess.run(["ip", "netns", "exec", ns, localpar, "run", job, "--stages=2",
                            "--replicas=2", "--quiet", f"--out={os.path.join(d, name)}", *flags],
                           capture_output=True, text=True, timeout=240)
        cap.send_signal(signal.SIGTERM)
        cap.wait(timeout=30)
        with open(pcap, "rb") as f:
            return r.returncode, r.stdout + r.stderr, f.read()
    finally:
        if cap is not None and cap.poll() is None:
            cap.kill()
            cap.wait()
        subprocess.run(["ip", "netns", "del", ns], check=False)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--capture":
        capture(sys.argv[2])
        return 0
    if os.geteuid() != 0:
        print("mesh_capture: skipped (needs root for a namespace and a packet socket)")
        return 0
    localpar, source = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    job = os.path.join(source, "deploy", "jobs", "synthetic_smoke.textproto")
    with tempfile.TemporaryDirectory(prefix="mesh_capture_") as d:
        make_certs(d)
        tls = [f"--tls_cert={d}/node.pem", f"--tls_key={d}/node.key", f"--tls_ca={d}/ca.pem",
               "--mtls"]
        rc, out, clear = captured_run(localpar, job, d, "clear", [])
        check(rc == 0, f"the run in the clear ends with 0 (got {rc}): {out[-2000:]}")
        check(b"LPMESH01" in clear and b"LPBUCKET" in clear,
              f"in the clear the capture ({len(clear)} bytes) holds the hello and the frames")
        rc, out, secure = captured_run(localpar, job, d, "tls", tls)
        check(rc == 0, f"the run under mutual TLS ends with 0 (got {rc}): {out[-2000:]}")
        check(len(secure) > 100000, f"the TLS run was captured ({len(secure)} bytes)")
        for magic in (b"LPMESH01", b"LPMESHOK", b"LPBUCKET"):
            check(magic not in secure, f"under TLS the capture holds no {magic.decode()}")
        ref = subprocess.run([localpar, "train", job, "--stages=2", "--replicas=2", "--quiet",
                              f"--out={d}/ref"], capture_output=True, text=True, timeout=240)
        check(ref.returncode == 0, f"localpar train ends with 0: {ref.stdout + ref.stderr}")
        with open(f"{d}/tls/weights.pb", "rb") as a, open(f"{d}/ref/weights.pb", "rb") as b:
            check(a.read() == b.read(), "the TLS cluster's weights equal localpar train's")
        print(f"capture: {len(clear)} bytes in the clear, {len(secure)} under TLS")
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    check(f"lpcap{os.getpid()}" not in left, "no namespace is left")
    if FAILURES:
        print(f"mesh_capture: {len(FAILURES)} failure(s)")
        return 1
    print("mesh_capture: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
