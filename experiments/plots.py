"""SVG plots through gnuplot (Debian's gnuplot-nox)."""

import os
import shutil
import subprocess

from experiments.common import fail


def gnuplot(script, plots_dir):
    if shutil.which("gnuplot") is None:
        fail("gnuplot is not installed (Debian package gnuplot-nox)")
    out = subprocess.run(["gnuplot"], input=script, capture_output=True, text=True,
                         cwd=plots_dir)
    if out.returncode != 0:
        fail(f"gnuplot failed: {out.stderr.strip()}")


def quote(s):
    return '"' + s.replace('"', "'") + '"'


def text(s):
    """A title or label for gnuplot's enhanced text mode: underscores stay underscores."""
    return quote(s.replace("\\", "/").replace("_", "\\\\_"))


def line_plot(plots_dir, name, series, title, xlabel, ylabel, style, extra=""):
    """One SVG: a line per (label, points) in `series`; returns its file name."""
    data = f"{name}.dat"
    with open(os.path.join(plots_dir, data), "w") as f:
        for label, points in series:
            f.write(f"# {label}\n")
            for x, y in points or [(0, "NaN")]:
                f.write(f"{x} {y}\n")
            f.write("\n\n")
    plots = ", ".join(f"{quote(data)} index {i} using 1:2 with {style} title {text(label)}"
                      for i, (label, _) in enumerate(series))
    out = f"{name}.svg"
    gnuplot(f"""set terminal svg size 720,420 dynamic background rgb 'white'
set output {quote(out)}
set title {text(title)}
set xlabel {text(xlabel)}
set ylabel {text(ylabel)}
set key outside right
set grid
{extra}
plot {plots}
""", plots_dir)
    return out
