#!/usr/bin/env bash
# Fails when a C++ or CUDA source breaks the repository's rules, naming each: over its size
# limit (services/ 450 lines a file, common/ 600, any function 120; deploy/check_limits.py),
# or formatted otherwise than the repo's .clang-format style.
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
/usr/bin/python3 deploy/check_limits.py || status=1
if ! command -v clang-format >/dev/null; then
  echo "check-format: clang-format not installed; formatting not checked"
  exit "$status"
fi
git ls-files '*.h' '*.cc' '*.cu' '*.cuh' | xargs clang-format --style=file --dry-run --Werror || status=1
[ "$status" = 0 ] && echo "check-format: ok"
exit "$status"
