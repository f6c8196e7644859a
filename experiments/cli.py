"""The command line both runners share, and how a front end runs and reports a Failure."""

import argparse
import os
import shlex
import signal
import sys

from experiments.common import Failure


def parser(doc, spec_help, results_help, reuse_help):
    p = argparse.ArgumentParser(description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", help=spec_help)
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--localpar", default="build/ci/localpar", help="the localpar binary")
    p.add_argument("--results", help=results_help)
    p.add_argument("--results_plots", help="where --results' plots are copied "
                   "(default: results/ next to it)")
    p.add_argument("--reuse", action="store_true", help=reuse_help)
    p.add_argument("--command", default=None,
                   help="the command line to print in the report (default: this one)")
    return p


def int_list(text):
    """argparse type: "2,4" -> [2, 4], every number >= 1."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected numbers >= 1, got {text!r}")
    return values


def check_localpar(args):
    if not os.access(args.localpar, os.X_OK):
        raise Failure(f"{args.localpar}: not an executable; build first or pass --localpar")
    args.localpar = os.path.abspath(args.localpar)


def this_command():
    """The command line, for a report's "regenerate with": the interpreter (one with
    python3-protobuf) and the arguments as typed."""
    return " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is, so that a sweep stops as on Ctrl-C."""


def raise_for_signal(signum, frame):
    """A signal handler: SIGTERM raises Terminated, any other signal KeyboardInterrupt."""
    raise (Terminated if signum == signal.SIGTERM else KeyboardInterrupt)(f"signal {signum}")


def main_of(program, body):
    """Runs `body()`; a Failure becomes `program: message` on stderr and exit status 2,
    Ctrl-C exit status 130 and SIGTERM 143 (128 + the signal), either of them once the runs
    under way are stopped (runs already finished are in the cache)."""
    signal.signal(signal.SIGTERM, raise_for_signal)
    try:
        return body()
    except Failure as e:
        print(f"{program}: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as e:
        how = "terminated" if isinstance(e, Terminated) else "interrupted"
        print(f"{program}: {how}; finished runs are kept (run it again to resume)",
              file=sys.stderr)
        sys.exit(128 + signal.SIGTERM if isinstance(e, Terminated) else 130)
