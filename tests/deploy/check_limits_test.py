#!/usr/bin/python3
"""deploy/check-format.sh against a repository of its own making: it passes a tree within the
limits, and fails naming the file or the function on a services/ file over 450 lines, a
common/ file over 600 and a function over 120 lines; braces in strings, comments and macros,
lambdas and class bodies do not fool the function count.

Usage: check_limits_test.py SOURCE_DIR
"""
import os
import shutil
import subprocess
import sys
import tempfile

SOURCE = os.path.abspath(sys.argv[1])
FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print(f"  FAIL: {what}", flush=True)


def function(name, lines, indent=""):
    body = "".join(f"{indent}  x += {i};\n" for i in range(lines - 3))
    return f"{indent}int {name}(int x) {{\n{body}{indent}  return x;\n{indent}}}\n"


def run(repo):
    return subprocess.run(["bash", "deploy/check-format.sh"], cwd=repo, capture_output=True,
                          text=True)


def main():
    with tempfile.TemporaryDirectory(prefix="localpar_limits.") as repo:
        os.makedirs(os.path.join(repo, "deploy"))
        for f in ("check-format.sh", "check_limits.py"):
            shutil.copy(os.path.join(SOURCE, "deploy", f), os.path.join(repo, "deploy", f))
        shutil.copy(os.path.join(SOURCE, ".clang-format"), os.path.join(repo, ".clang-format"))
        os.makedirs(os.path.join(repo, "services"))
        os.makedirs(os.path.join(repo, "common"))

        def write(path, text):
            with open(os.path.join(repo, path), "w") as f:
                f.write(text)
            subprocess.run(["clang-format", "-i", path], cwd=repo, check=True)

        # Within every limit: a 120-line function, tricky braces, a long lambda inside a short
        # function's neighbour, and a class with inline methods.
        tricky = ('#define OPEN {\n'
                  'const char* kText = "}}}{{{";  // } a brace in a comment {\n'
                  "const char kBrace = '}';\n"
                  '/* } { */\n'
                  "struct S {\n" + function("Inline", 20, "  ") + "};\n"
                  + function("Exactly", 120)
                  + "int Lambda() {\n  auto f = [](int a) {\n    return a + 1;\n  };\n"
                  "  return f(1);\n}\n")
        write("common/ok.cc", tricky)
        write("services/small.cc", function("Small", 10))
        subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
        subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
        r = run(repo)
        check(r.returncode == 0 and "check-format: ok" in r.stdout,
              f"a tree within the limits: {r.returncode}\n{r.stdout}{r.stderr}")

        # A function one line over, in a class body (indented) and at namespace scope.
        write("common/long.cc", "namespace n {\n" + function("TooLong", 121) + "}  // namespace n\n"
              + "class C {\n public:\n" + function("LongMethod", 125, "  ") + "};\n")
        # Files over their limits: services/ at 451 lines, common/ at 601.
        write("services/big.cc", "".join(f"int v{i} = {i};\n" for i in range(451)))
        write("common/big.cc", "".join(f"int w{i} = {i};\n" for i in range(601)))
        write("common/fine.cc", "".join(f"int u{i} = {i};\n" for i in range(600)))
        subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
        r = run(repo)
        out = r.stdout
        check(r.returncode != 0, f"over the limits, exit {r.returncode}\n{out}")
        check("common/long.cc:2: TooLong is 121 lines" in out, f"the long function: {out}")
        check("LongMethod is 125 lines" in out, f"the long method: {out}")
        check("services/big.cc: 451 lines" in out, f"the big services/ file: {out}")
        check("common/big.cc: 601 lines" in out, f"the big common/ file: {out}")
        check("common/fine.cc" not in out and "Exactly" not in out and "Inline" not in out
              and "Lambda" not in out, f"something within the limits was named: {out}")
    print("check_limits_test: " + ("ok" if not FAILURES else f"{len(FAILURES)} failed"))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
