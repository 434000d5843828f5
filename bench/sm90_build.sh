#!/bin/bash
# Builds the Hopper forward objects + the ctypes shim here (no GPU needed): sm90.cu, the forward
# instantiations and bench/sm90_shim.cu, nothing else of the library (the backward's dispatch,
# sm90_bwd.cu, needs the library's runtime). Usage: bench/sm90_build.sh (output: $B/libfa_sm90.so)
set -e
cd "$(dirname "$0")/.."
B=${SM90_BUILD_DIR:-build-sm90}; mkdir -p $B/obj
NVCC=/usr/local/cuda/bin/nvcc
FLAGS="-O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Iinclude -Isrc -Xcompiler -fPIC -Xptxas -v $SM90_EXTRA_FLAGS"
one() { n=$(basename "$1" .cu); $NVCC $FLAGS -c "$1" -o $B/obj/$n.o > $B/obj/$n.log 2>&1 || { cat $B/obj/$n.log; return 1; }; }
export -f one; export NVCC FLAGS B
ls src/cuda/sm90/sm90.cu src/cuda/inst/sm90_fwd_*.cu bench/sm90_shim.cu | xargs -P ${SM90_JOBS:-2} -I{} bash -c 'one {}'
$NVCC -shared -gencode arch=compute_90a,code=sm_90a $B/obj/*.o -o $B/libfa_sm90.so
