#!/usr/bin/env bash
# Link-time stand-ins for the CUDA libraries cudarc links by name (libcuda, libcublas,
# libcublasLt, libcurand), for building the `cuda` feature on a machine without a GPU
# or a CUDA install: each exports every function cudarc's bindings declare, with the
# real library's soname, so the binary loads the GPU machine's real libraries at run time.
# CUDA 13.0's compiler, headers and runtime come from PyPI into $CUDA_ROOT first:
#
#   pip download --no-deps --only-binary=:all: --platform manylinux_2_17_x86_64 \
#     --python-version 3.12 -d wheels nvidia-cuda-nvcc==13.0.88 nvidia-cuda-runtime==13.0.96 \
#     nvidia-cuda-crt==13.0.88 nvidia-cuda-nvrtc==13.0.88 nvidia-nvvm==13.0.88 'nvidia-cuda-cccl==13.0.*'
#   for w in wheels/*.whl; do unzip -q -o "$w" -d x; done; cp -r x/nvidia/cu13 /opt/cuda13
#   chmod +x /opt/cuda13/bin/* /opt/cuda13/nvvm/bin/*
#   docs/benchmarks/cuda/h100-2026-11-28/stubs.sh /opt/cuda13
#   CUDA_ROOT=/opt/cuda13 PATH=/opt/cuda13/bin:$PATH CUDA_COMPUTE_CAP=90 \
#     RUSTFLAGS="-C target-cpu=x86-64-v3" cargo build --release -p memagent-cli --features cuda
set -euo pipefail
root="$1"
cudarc="$(ls -d ~/.cargo/registry/src/*/cudarc-0.19.* | sort -V | tail -1)"
stubs="$root/lib64/stubs"
mkdir -p "$stubs"
stub() { # module, library name, soname
  grep -oE '^\s+fn [A-Za-z0-9_]+\(' "$cudarc/src/$1/sys/mod.rs" |
    sed -E 's/^\s+fn ([A-Za-z0-9_]+)\(/\1/' | sort -u |
    awk '{print "void "$1"(void){}"}' > "$stubs/$1.c"
  gcc -shared -fPIC -o "$stubs/$3" -Wl,-soname,"$3" "$stubs/$1.c"
  ln -sf "$3" "$stubs/lib$2.so"
}
stub driver cuda libcuda.so.1
stub cublas cublas libcublas.so.13
stub cublaslt cublasLt libcublasLt.so.13
stub curand curand libcurand.so.10
ln -sf libnvrtc.so.13 "$root/lib/libnvrtc.so"
ln -sf libcudart.so.13 "$root/lib/libcudart.so"
