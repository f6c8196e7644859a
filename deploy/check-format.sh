#!/usr/bin/env bash
# Fails when a C++ or CUDA source differs from the repo's .clang-format style.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null; then
  echo "check-format: clang-format not installed; skipped"
  exit 0
fi
git ls-files '*.h' '*.cc' '*.cu' '*.cuh' | xargs clang-format --style=file --dry-run --Werror
echo "check-format: ok"
