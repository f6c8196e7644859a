#!/usr/bin/env bash
# Installs localpar's build and test dependencies from Debian 12 packages; a no-op when present.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev libgtest-dev libgmock-dev libssl-dev
  libopenblas-dev libdnnl-dev zlib1g-dev libpng-dev libmicrohttpd-dev dataset-fashion-mnist
  prometheus curl docker.io cgroupfs-mount apparmor docker-compose debootstrap openssl
  clang-14 libclang-rt-14-dev
  fortunes gnuplot-nox python3 python3-grpcio python3-grpc-tools python3-protobuf python3-numpy python3-yaml
  # PyTorch: the export test loads the safetensors export with load_state_dict(strict=True)
  python3-torch
  # SciPy: the testbed's calibrated cost model (least squares with bounds)
  python3-scipy
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
