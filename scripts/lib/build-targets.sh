# shellcheck shell=bash
# Sourced by the benchmark scripts. build_targets ROOT DIR TARGET...: builds TARGET... in the
# build directory DIR (configured as scripts/build configures it when it has no build files
# yet), so a benchmark never times a binary older than its source; exits with ninja's status,
# its last lines shown, when the build fails.
build_targets() {
  local root=$1 dir=$2 log status=0
  shift 2
  if [[ ! -f $dir/build.ninja ]]; then
    cmake -S "$root" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DXS_WERROR=ON >/dev/null
  fi
  log=$(cmake --build "$dir" --target "$@" 2>&1) || status=$?
  if ((status != 0)); then
    tail -n 20 <<<"$log" >&2
    echo "build of $* in $dir failed" >&2
    exit "$status"
  fi
}
