#!/usr/bin/env bash
# scripts/lib/build-targets.sh, which the benchmark scripts source so that they never time a
# binary older than its source: on a small CMake project of its own, build_targets configures
# a build directory that has none, builds the target, rebuilds it after its source changed,
# and fails naming the target when the build fails. Then every benchmark script that times
# build/ binaries must call it.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# shellcheck source-path=SCRIPTDIR source=../../scripts/lib/build-targets.sh
source "$repo/scripts/lib/build-targets.sh"

mkdir "$work/src"
cat >"$work/src/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.16)
project(build_targets_probe C)
add_executable(probe probe.c)
CMAKE
echo 'int main(void) { return 3; }' >"$work/src/probe.c"

fail() { echo "build_targets_test: $*" >&2; exit 1; }
status() { local s=0; "$@" || s=$?; echo "$s"; }

build_targets "$work/src" "$work/build" probe
[[ -f $work/build/build.ninja ]] || fail "the build directory was not configured"
[[ $(status "$work/build/probe") == 3 ]] || fail "the first build did not make probe"

sleep 1  # a newer modification time than the object's, on any file system
echo 'int main(void) { return 4; }' >"$work/src/probe.c"
build_targets "$work/src" "$work/build" probe
[[ $(status "$work/build/probe") == 4 ]] || fail "probe was not rebuilt after its source changed"

out=$( (build_targets "$work/src" "$work/build" no_such_target) 2>&1) && fail "an unknown target built"
grep -q "build of no_such_target in $work/build failed" <<<"$out" || fail "no error naming the target: $out"

for script in bench-optimizers bench-scaling bench-precision bench-trace; do
  grep -q 'build_targets "$root" "$build_dir"' "$repo/scripts/$script" ||
    fail "scripts/$script times build/ binaries without building them first"
done
echo "build_targets_test: passed"
