#!/usr/bin/python3
"""The testbed of emulated devices (deploy/testbed.py), as root, on 2 devices and 2 link
settings: a cluster on it ends bitwise equal to `localpar train`; a 4 Mbit/s link holds a run
to at least the time its bytes need at that rate, and a run stopped at its budget there is
killed soon after instead of draining what was fed; DiLoCo-style data parallelism on it is
bitwise equal to `localpar train` too; nothing it made (namespaces, qdiscs,
cgroups) is left after a run, after SIGTERM, or after SIGKILL once `clean` has run; and a
user who is not root is refused, saying why. The CI smoke of the measurement testbed.

Usage: testbed_test.py LOCALPAR_BINARY SOURCE_DIR
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

LOCALPAR, SOURCE = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
TESTBED = os.path.join(SOURCE, "deploy", "testbed.py")
FAILURES = []

# A small network whose first hop is wide: 32 rows x 512 floats = 64 KiB a step from device 0
# to device 1, and 32 x 64 floats (8 KiB) from the coordinator.
JOB = """name: "testbed_smoke"
rule: GREEDY
batch_size: 32
seed: 3
data { synthetic { train_examples: 2048 test_examples: 256 shape: [64] classes: 4 seed: 2
                   noise: 0.5 } }
optimizer { adamw {} }
schedule { lr: 0.003 }
stages { layers { linear { out_features: 512 } } layers { relu {} } head { kind: LINEAR } }
stages { layers { linear { out_features: 32 } } layers { relu {} } head { kind: LINEAR } }
"""


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print(f"  FAIL: {what}", flush=True)


def leftovers():
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    names = [line.split()[0] for line in netns.splitlines() if line.startswith("lptb")]
    groups = [d for d in os.listdir("/sys/fs/cgroup/cpu") if d.startswith("lptb")] \
        if os.path.isdir("/sys/fs/cgroup/cpu") else []
    return names + groups


def testbed(*args, timeout=150):
    return subprocess.run([TESTBED, *args, f"--localpar={LOCALPAR}"] if args[0] == "run"
                          else [TESTBED, *args], capture_output=True, text=True,
                          timeout=timeout)


def main():
    if os.geteuid() != 0:
        print("testbed_test: skipped (needs root)")
        return 0
    with tempfile.TemporaryDirectory(prefix="localpar_testbed.") as tmp:
        os.chmod(tmp, 0o755)
        job = os.path.join(tmp, "job.textproto")
        with open(job, "w") as f:
            f.write(JOB)
        common = [job, "--devices=2", "--method=GREEDY", "--max_steps=40",
                  "--eval_every_steps=20", "--batch_size=32", "--lr=0.003", "--seed=3"]
        # Unshaped: bitwise equal to the reference trainer.
        r = testbed("run", *common, f"--out={tmp}/fast", "--check_reference")
        check(r.returncode == 0 and "bitwise equal" in r.stderr,
              f"unshaped run: exit {r.returncode}\n{r.stderr[-3000:]}")
        check(not leftovers(), f"left after a run: {leftovers()}")
        fast = json.load(open(f"{tmp}/fast/result.json")) if r.returncode == 0 else {}
        # DiLoCo-style data parallelism (2 replicas synchronising every 50 steps, here at the
        # last of 40): bitwise equal too, and its job says so.
        diloco = [a if a != "--method=GREEDY" else "--method=diloco_dp" for a in common]
        r = testbed("run", *diloco, f"--out={tmp}/diloco", "--check_reference")
        check(r.returncode == 0 and "bitwise equal" in r.stderr,
              f"diloco_dp run: exit {r.returncode}\n{r.stderr[-3000:]}")
        if r.returncode == 0:
            with open(f"{tmp}/diloco/job.textproto") as f:
                check("every: 50" in f.read(), "the diloco_dp job synchronises every 50 steps")
            res = json.load(open(f"{tmp}/diloco/result.json"))
            check(res["config"].get("sync_every") == 50, f"its config: {res['config']}")
        check(not leftovers(), f"left after a DiLoCo run: {leftovers()}")
        # 4 Mbit/s: 40 steps of 64 KiB from device 0 to device 1 need at least 5.2 s.
        r = testbed("run", *common, "--link_mbit=4", f"--out={tmp}/slow", "--check_reference")
        check(r.returncode == 0, f"4 Mbit/s run: exit {r.returncode}\n{r.stderr[-3000:]}")
        if r.returncode == 0 and fast:
            slow = json.load(open(f"{tmp}/slow/result.json"))
            need = 40 * 32 * 512 * 4 * 8 / 4e6
            check(slow["seconds"] >= 0.8 * need,
                  f"the link did not hold the run: {slow['seconds']:.1f} s at 4 Mbit/s "
                  f"(its bytes need {need:.1f} s), {fast['seconds']:.1f} s unshaped")
            # The evaluation within the epoch is timed: the coordinator writes a training line
            # as soon as the last stage has trained the step it follows (the test at the end
            # of the epoch is not: no training line of its step is written before it).
            timed = [p.get("eval_seconds") for p in slow["points"]]
            check(timed and timed[0] is not None and 0 <= timed[0] < slow["seconds"],
                  f"the evaluation at step 20 not timed: {timed}")
            check("evaluations took" in r.stderr, f"the run's line: {r.stderr[-500:]}")
        check(not leftovers(), f"left after a shaped run: {leftovers()}")
        # Stopped at its budget on that link, where the coordinator feeds far ahead: killed
        # 1 s after the stop instead of draining every step fed.
        budget = [job, "--devices=2", "--link_mbit=4", "--max_steps=100000",
                  "--eval_every_steps=10", "--batch_size=32", "--max_seconds=3",
                  "--drain_seconds=1", f"--out={tmp}/budget"]
        r = testbed("run", *budget)
        check(r.returncode == 0 and "killed 1 s after its stop" in r.stderr,
              f"a run stopped at its budget: exit {r.returncode}\n{r.stderr[-3000:]}")
        if r.returncode == 0:
            res = json.load(open(f"{tmp}/budget/result.json"))
            check(res["out_of_time"] and not res["drained"] and res["seconds"] < 8,
                  f"the budget run: out of time {res['out_of_time']}, drained "
                  f"{res['drained']}, {res['seconds']:.1f} s")
        check(not leftovers(), f"left after a killed run: {leftovers()}")
        # SIGTERM mid-run: it stops, and removes everything it made.
        long = [job, "--devices=2", "--max_steps=100000", "--eval_every_steps=0",
                f"--localpar={LOCALPAR}"]
        p = subprocess.Popen([TESTBED, "run", *long, f"--out={tmp}/term"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        time.sleep(4)
        check(leftovers(), "no testbed was up to be interrupted")
        p.send_signal(signal.SIGTERM)
        out = p.communicate(timeout=60)[0]
        check(p.returncode == 143, f"SIGTERM: exit {p.returncode}, want 143")
        check(not leftovers(), f"left after SIGTERM: {leftovers()}\n{out[-2000:]}")
        # SIGKILL leaves it all; `clean` removes it.
        p = subprocess.Popen([TESTBED, "run", *long, f"--out={tmp}/kill"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(4)
        p.kill()
        p.wait()
        check(leftovers(), "a SIGKILLed testbed left nothing (was it up?)")
        r = testbed("clean")
        check(r.returncode == 0 and not leftovers(),
              f"clean: exit {r.returncode}, left {leftovers()}\n{r.stderr}")
        # Not root: refused, saying why, before anything is made.
        sys.path.insert(0, SOURCE)
        from experiments.common import Failure
        from experiments.testbed import devices
        real = os.geteuid
        os.geteuid = lambda: 1000
        try:
            devices.Testbed(2)
            check(False, "a testbed was made without root")
        except Failure as e:
            check("needs root" in str(e), f"not root: {e}")
        finally:
            os.geteuid = real
    print("testbed_test: " + ("ok" if not FAILURES else f"{len(FAILURES)} failed"))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
