#!/usr/bin/python3
"""Fails on any C++ or CUDA source over its size limit, naming each: a file under services/
over 450 lines or under common/ over 600, and any function over 120 lines anywhere.

  deploy/check_limits.py [FILE...]    # default: every tracked *.h *.cc *.cu *.cuh

A function's length runs from the line its declaration starts on to its closing brace. The
scan strips comments and string and character literals, then follows braces: a brace opened
at namespace or class scope after a parameter list (and not by a class, enum, namespace or
an initializer) is a function body; lambdas and blocks inside it count toward it. Exit 1
when something is over, 0 otherwise.
"""

import os
import re
import subprocess
import sys

FILE_LIMITS = {"services/": 450, "common/": 600}
FUNCTION_LIMIT = 120
SUFFIXES = (".h", ".cc", ".cu", ".cuh")


def strip(text):
    """`text` with comments, string and character literals blanked (newlines kept, so line
    numbers still hold)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == 'R' and text.startswith('R"', i) and (i == 0 or not text[i - 1].isalnum()):
            m = re.match(r'R"([^(]*)\(', text[i:])
            end = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + " " * (j - i - 2) + c if j - i >= 2 else text[i:j])
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


NOT_FUNCTION = re.compile(r"\b(namespace|class|struct|union|enum)\b|^\s*extern\b|=\s*$|"
                          r"^\s*(do|else|try)\s*$")


def functions(text):
    """(name, first line, last line) of every function body in the source `text`."""
    code = strip(text)
    found = []
    # Each scope: (kind, start offset of the statement that opened it).
    stack = []
    statement_start = 0
    for i, c in enumerate(code):
        if c == "{":
            head = code[statement_start:i]
            inside_function = any(kind == "function" for kind, _, _ in stack)
            if inside_function:
                kind = "block"
            elif ")" in head and not NOT_FUNCTION.search(head.strip()) and "(" in head:
                kind = "function"
            else:
                kind = "scope"
            stack.append((kind, statement_start, head))
            statement_start = i + 1
        elif c == "}":
            if stack:
                kind, start, head = stack.pop()
                if kind == "function":
                    first = code.count("\n", 0, start + len(head) - len(head.lstrip())) + 1
                    last = code.count("\n", 0, i) + 1
                    name = re.findall(r"([~\w:]+)\s*\(", head)
                    found.append((name[0] if name else "?", first, last))
            statement_start = i + 1
        elif c == ";" or (c == ":" and code[i - 1:i + 1] != "::" and code[i:i + 2] != "::"
                          and re.search(r"\b(public|private|protected)\s*$", code[statement_start:i])):
            statement_start = i + 1
        elif c == "#" and (i == 0 or code[i - 1] == "\n"):
            pass
    return found


def preprocessor_free(text):
    """Preprocessor lines blanked (a macro body's braces are not the code's)."""
    lines = text.split("\n")
    out, continued = [], False
    for line in lines:
        directive = continued or line.lstrip().startswith("#")
        continued = directive and line.rstrip().endswith("\\")
        out.append(" " * len(line) if directive else line)
    return "\n".join(out)


def check(path, text):
    """Every limit `path` breaks, as lines to print."""
    problems = []
    lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
    for prefix, limit in FILE_LIMITS.items():
        if path.startswith(prefix) and lines > limit:
            problems.append(f"{path}: {lines} lines; files under {prefix} stay within {limit}")
    for name, first, last in functions(preprocessor_free(text)):
        length = last - first + 1
        if length > FUNCTION_LIMIT:
            problems.append(f"{path}:{first}: {name} is {length} lines; functions stay within "
                            f"{FUNCTION_LIMIT}")
    return problems


def main(argv):
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True,
                          text=True).stdout.strip() or os.getcwd()
    paths = argv[1:] or [p for p in subprocess.run(
        ["git", "ls-files", "--", "*.h", "*.cc", "*.cu", "*.cuh"], capture_output=True,
        text=True, cwd=root).stdout.split() if p.endswith(SUFFIXES)]
    problems = []
    for path in paths:
        full = path if os.path.isabs(path) else os.path.join(root, path)
        if not os.path.exists(full):
            continue  # deleted in the work tree, not yet in the index
        with open(full, errors="replace") as f:
            problems += check(os.path.relpath(full, root), f.read())
    for p in problems:
        print(p)
    if problems:
        print(f"check-limits: {len(problems)} over the limits (services/ 450 and common/ 600 "
              f"lines a file, {FUNCTION_LIMIT} a function): split them")
        return 1
    print(f"check-limits: ok ({len(paths)} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
