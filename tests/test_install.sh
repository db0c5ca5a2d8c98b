#!/bin/sh
# test_install.sh BUILD_DIR SOURCE_DIR LIBDIR — gpipe installed as a user
# installs it: `cmake --install` into a fresh prefix puts the header, the
# library, the tools, gpipe.pc and the CMake package there; the shipped
# example then builds with nothing but `cc $(pkg-config --cflags --libs
# gpipe)`, and as a CMake project with find_package(gpipe) and with
# pkg_check_modules, and runs (it exits non-zero unless it learns), and the
# installed gpipe-train runs.
set -eu
build=$1 src=$2 libdir=$3
tmp=$(mktemp -d /tmp/gpipe_installXXXXXX)
trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/prefix"
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log"
for f in include/gpipe.h "$libdir/libgpipe.a" "$libdir/pkgconfig/gpipe.pc" bin/gpipe-train \
         bin/gpipe-balance bin/gpipe-sample "$libdir/cmake/gpipe/gpipeConfig.cmake" \
         "$libdir/cmake/gpipe/gpipeConfigVersion.cmake" share/man/man1/gpipe-train.1 \
         share/man/man1/gpipe-balance.1 share/man/man1/gpipe-sample.1; do
  [ -f "$prefix/$f" ] || { echo "test_install: $f was not installed"; cat "$tmp/install.log"; exit 1; }
done
grep -q "^prefix=$prefix\$" "$prefix/$libdir/pkgconfig/gpipe.pc" || {
  echo "test_install: gpipe.pc does not name the install prefix:"; cat "$prefix/$libdir/pkgconfig/gpipe.pc"; exit 1; }
export PKG_CONFIG_PATH="$prefix/$libdir/pkgconfig"
# shellcheck disable=SC2046 # the flags are words
cc -std=c11 -D_POSIX_C_SOURCE=200809L $(pkg-config --cflags gpipe) "$src/examples/pipeline_api.c" \
   -o "$tmp/example" $(pkg-config --libs gpipe)
"$tmp/example" >"$tmp/example.log" || { echo "test_install: the example failed:"; cat "$tmp/example.log"; exit 1; }
# CMake users: find_package(gpipe) and its gpipe::gpipe, and pkg-config's
# imported target (which took the .pc's library paths for link options and
# put them before the objects, where --as-needed dropped them)
for how in package pkgconfig; do
  mkdir -p "$tmp/cm-$how"
  cp "$src/examples/pipeline_api.c" "$tmp/cm-$how/"
  if [ "$how" = package ]; then
    link='find_package(gpipe 0.1 REQUIRED)
target_link_libraries(ex PRIVATE gpipe::gpipe)'
  else
    link='find_package(PkgConfig REQUIRED)
pkg_check_modules(GPIPE REQUIRED IMPORTED_TARGET gpipe)
target_link_libraries(ex PRIVATE PkgConfig::GPIPE)'
  fi
  printf '%s\n' 'cmake_minimum_required(VERSION 3.16)' 'project(uses_gpipe C)' \
    'add_executable(ex pipeline_api.c)' \
    'target_compile_definitions(ex PRIVATE _POSIX_C_SOURCE=200809L)' "$link" \
    >"$tmp/cm-$how/CMakeLists.txt"
  if ! { cmake -S "$tmp/cm-$how" -B "$tmp/cm-$how/b" -DCMAKE_PREFIX_PATH="$prefix" &&
         cmake --build "$tmp/cm-$how/b"; } >"$tmp/cm-$how.log" 2>&1; then
    echo "test_install: a CMake project using gpipe ($how) does not build:"; tail -30 "$tmp/cm-$how.log"; exit 1
  fi
  "$tmp/cm-$how/b/ex" >"$tmp/cm-$how/run.log" || {
    echo "test_install: the example built by CMake ($how) failed:"; cat "$tmp/cm-$how/run.log"; exit 1; }
done
# the installed tools carry the rpath to the libraries the loader does not
# search by default (Open MPI's, CUDA's), as the .pc does
for d in $(grep -o -- '-Wl,-rpath,[^ ]*' "$prefix/$libdir/pkgconfig/gpipe.pc" | sed 's/-Wl,-rpath,//'); do
  readelf -d "$prefix/bin/gpipe-train" | grep -E "R(UN)?PATH" | grep -q -- "$d" || {
    echo "test_install: installed gpipe-train lacks the rpath $d"; readelf -d "$prefix/bin/gpipe-train" | grep -E "R(UN)?PATH"; exit 1; }
done
# The CUDA backend, where built, is a plugin the installed tools find in
# <libdir>/gpipe beside their bin/ (the prefix given here, not the
# configured one): cuda:0 then gets as far as asking for the GPU.
if [ -f "$build/libgpipe-cuda.so" ]; then
  [ -f "$prefix/$libdir/gpipe/libgpipe-cuda.so" ] || {
    echo "test_install: $libdir/gpipe/libgpipe-cuda.so was not installed"; exit 1; }
  printf '%s\n' 'model: {input: [1, 8, 8], layers: [flatten, {linear: {out: 10}}]}' \
    'data: {dataset: synthetic, synthetic: {train: 32, test: 16}}' \
    'train: {batch_size: 16, steps: 1, log_every: 0}' 'pipeline: {devices: [cuda:0]}' >"$tmp/cuda.yaml"
  if ! "$prefix/bin/gpipe-train" "$tmp/cuda.yaml" --no-progress >"$tmp/cuda.log" 2>&1 &&
     ! grep -q "no CUDA device 0" "$tmp/cuda.log"; then
    echo "test_install: installed gpipe-train does not find its CUDA plugin:"; cat "$tmp/cuda.log"; exit 1
  fi
fi
"$prefix/bin/gpipe-train" --version | grep -q "^gpipe-train " || { echo "test_install: installed gpipe-train does not run"; exit 1; }
"$prefix/bin/gpipe-train" "$src/configs/default.yaml" --dry-run | grep -q "^total: " || {
  echo "test_install: installed gpipe-train --dry-run failed"; exit 1; }
echo "test_install: installed files, pkg-config build of the example, its run and the installed tools all passed"
