#!/usr/bin/env bash
# The installed package as a user of it meets it (issue "usable from outside"):
#   package_test.sh install BUILD SOURCE   cmake --install into a scratch prefix; the
#       out-of-tree example (examples/out_of_tree, only find_package(xla_spawn)) builds
#       against it and runs under the installed xla-spawn -n 2; the same example built with
#       pkg-config alone; a user's own base/, runtime/, ... headers shadow none of ours.
#   package_test.sh deb BUILD SOURCE       scripts/package on BUILD (cpack -G DEB); its
#       dependencies are installed Debian packages; unpacked into a scratch root (dpkg-deb -x)
#       its xla-spawn prints the version, its man page renders without warnings and lists
#       every option of --help, and the example builds against it and runs. With the Python
#       package built, python3-xla-spawn too: its dependencies, and the NumPy example run
#       through `python3 -m xla_spawn` from the unpacked tree (so also after install).
#   package_test.sh completion BUILD SOURCE   the bash completion offers the options, a
#       directory after --log-dir, and hands over to the command after it starts.
set -euo pipefail
mode=$1
build=$(cd "$2" && pwd)
source=$(cd "$3" && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
fail() {
  echo "package_test: $*" >&2
  exit 1
}
version=$(sed -nE 's/^project\(xla_spawn VERSION ([0-9.]+).*/\1/p' "$source/CMakeLists.txt")
[[ -n $version ]] || fail "no version in CMakeLists.txt"

# build_and_run PREFIX NAME: the out-of-tree example configured with only PREFIX to find
# xla_spawn, built, run as 2 replicas under PREFIX's xla-spawn; both replicas report 1 + 4.
build_and_run() {
  local prefix=$1 name=$2 out
  cmake -S "$source/examples/out_of_tree" -B "$scratch/$name" -G Ninja \
    -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >"$scratch/$name.log" 2>&1 ||
    { cat "$scratch/$name.log" >&2; fail "$name: configuring the example failed"; }
  cmake --build "$scratch/$name" >>"$scratch/$name.log" 2>&1 ||
    { cat "$scratch/$name.log" >&2; fail "$name: building the example failed"; }
  run_example "$prefix" "$scratch/$name/sum_replicas" "$name"
  out=$("$scratch/$name/spawn_replicas" 2>&1) ||
    { echo "$out" >&2; fail "$name: spawn_replicas (xla_spawn::launcher alone) failed"; }
  grep -q "child 1 of 2" <<<"$out" || { echo "$out" >&2; fail "$name: spawn_replicas' child 1 did not report"; }
  echo "package_test: $name: spawn(fn) linked with xla_spawn::launcher alone ran 2 children"
}

run_example() {
  local prefix=$1 program=$2 name=$3 out
  out=$("$prefix/bin/xla-spawn" -n 2 -- "$program" 2>&1) ||
    { echo "$out" >&2; fail "$name: the example failed under the installed xla-spawn"; }
  for k in 0 1; do
    grep -q "^\[$k\] ordinal $k of 2: sum of squares 5$" <<<"$out" ||
      { echo "$out" >&2; fail "$name: ordinal $k did not report the sum"; }
  done
  echo "package_test: $name: example ran under $prefix/bin/xla-spawn -n 2"
}

# Every long option `xla-spawn --help` lists ("  -n [ --nprocs ] N", "  --version", ...).
help_options() {
  "$1" --help | grep -oE '^  (-[a-z] \[ )?--[a-z-]+' | grep -oE -- '--[a-z-]+'
}

check_version() {
  local got
  got=$("$1/bin/xla-spawn" --version)
  [[ $got == "xla-spawn $version" ]] || fail "--version printed '$got', expected 'xla-spawn $version'"
}

# check_depends DEB: every dependency of DEB is a Debian package this machine, which built and
# tested the package, has: one of its alternatives (version ignored) is an installed package or
# provided by one (libspdlog1.10 provides libspdlog1.10-fmt9); xla-spawn itself, for the
# Python package, is the other package built here.
check_depends() {
  local deb=$1 depends have dep found alternative
  depends=$(dpkg-deb -f "$deb" Depends)
  [[ -n $depends ]] || fail "$(basename "$deb") declares no dependencies"
  have=$( (echo xla-spawn; dpkg-query -W -f='${db:Status-Abbrev} ${Package} ${Provides}\n' |
    awk '$1 == "ii" { for (i = 2; i <= NF; i++) { sub(/,$/, "", $i); if ($i !~ /^[(=<>]/ && $i !~ /\)$/) print $i } }' |
    sed 's/:.*//') | sort -u)
  while read -r dep; do
    found=""
    for alternative in ${dep//|/ }; do
      [[ $alternative == \(* || $alternative == *\) ]] && continue
      grep -qxF "$alternative" <<<"$have" && found=$alternative
    done
    [[ -n $found ]] || fail "$(basename "$deb"): dependency '$dep' is neither an installed Debian package nor provided by one"
  done < <(tr ',' '\n' <<<"$depends" | sed -E 's/^ +//; s/ +$//' | grep .)
  echo "package_test: $(basename "$deb"): Depends: $depends"
}

# run_python ROOT SITE NAME: when the Python package was built, the one installed under SITE
# (ROOT's lib/python3.X/dist-packages) runs the NumPy example as 2 replicas through
# `python3 -m xla_spawn`, which must find ROOT/bin/xla-spawn beside the package.
run_python() {
  local prefix=$1 site=$2 name=$3 out
  [[ -d $build/python/xla_spawn ]] || return 0
  [[ -f $site/xla_spawn/__init__.py ]] || fail "$name: no Python package under $site"
  out=$(cd "$scratch" && env -u XLA_SPAWN_LAUNCHER PATH=/usr/bin:/bin PYTHONPATH="$site" \
    XLA_SPAWN_NO_TORCH=1 /usr/bin/python3 -m xla_spawn -n 2 -- /usr/bin/python3 \
    "$source/examples/python/numpy_all_reduce.py" 2>&1) ||
    { echo "$out" >&2; fail "$name: the Python example failed"; }
  grep -q "^\[1\] ordinal 1 of 2: sum 3$" <<<"$out" || { echo "$out" >&2; fail "$name: no sum from ordinal 1"; }
  echo "package_test: $name: the Python package ran under $prefix/bin/xla-spawn"
}

site=lib/python3.$(/usr/bin/python3 -c 'import sys; print(sys.version_info.minor)' 2>/dev/null || true)/dist-packages
case $mode in
  install)
    prefix=$scratch/prefix
    cmake --install "$build" --prefix "$prefix" >"$scratch/install.log" ||
      { cat "$scratch/install.log" >&2; fail "cmake --install failed"; }
    check_version "$prefix"
    [[ -f $prefix/include/xla_spawn/replica/xm.h ]] || fail "no include/xla_spawn/replica/xm.h"
    for layer in base cluster shm collectives runtime replica launcher; do
      [[ ! -e $prefix/include/$layer ]] || fail "include/$layer installed outside include/xla_spawn"
    done
    build_and_run "$prefix" cmake-package
    # A user whose own include path has a header of the same name as any of ours, under the
    # same folder (base/log.h, runtime/ops.h, ...): had an installed header included another
    # without the prefix, it would get the user's, which stops the build. One file includes
    # every installed header, so all of them are checked, not only those the example uses.
    (cd "$prefix/include/xla_spawn" && find . -name '*.h' -o -name '*.def') | sort | while read -r h; do
      mkdir -p "$scratch/user/$(dirname "$h")"
      echo "#error the user's own $h was included instead of xla_spawn's" >"$scratch/user/$h"
      if [[ $h == *.h ]]; then echo "#include \"xla_spawn/${h#./}\"" >>"$scratch/all_headers.cpp"; fi
    done
    headers=$(grep -c . "$scratch/all_headers.cpp")
    export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
    # pkg-config's flags alone (no -std: the package must bring C++20 itself).
    # shellcheck disable=SC2046  # pkg-config's output is a word list
    g++ -fsyntax-only -I"$scratch/user" $(pkg-config --cflags xla_spawn) "$scratch/all_headers.cpp" ||
      fail "the $headers installed headers do not compile together with pkg-config's flags and a user's same-named headers first"
    echo "package_test: all $headers installed headers compile with a user's same-named ones first"
    # shellcheck disable=SC2046
    g++ -O1 -I"$scratch/user" "$source/examples/out_of_tree/main.cpp" \
      $(pkg-config --cflags --libs xla_spawn) -o "$scratch/sum_pc" ||
      fail "building the example with pkg-config failed"
    run_example "$prefix" "$scratch/sum_pc" pkg-config
    # The README's ordinal-aware binary, as printed there, builds and runs.
    sed -n '/^### An ordinal-aware binary/,/^```$/p' "$source/README.md" |
      sed -n '/^```cpp$/,/^```$/p' | grep -v '^```' >"$scratch/readme_ordinal.cpp"
    grep -q "int main" "$scratch/readme_ordinal.cpp" || fail "no program under the README's 'An ordinal-aware binary'"
    # shellcheck disable=SC2046
    g++ -O1 "$scratch/readme_ordinal.cpp" $(pkg-config --cflags --libs xla_spawn) -o "$scratch/readme_ordinal" ||
      fail "the README's ordinal-aware binary does not build as printed"
    out=$("$prefix/bin/xla-spawn" -n 2 -- "$scratch/readme_ordinal" 2>&1) ||
      { echo "$out" >&2; fail "the README's ordinal-aware binary failed"; }
    grep -q "replica 1 of 2" <<<"$out" || { echo "$out" >&2; fail "the README's binary did not log 'replica 1 of 2'"; }
    echo "package_test: the README's ordinal-aware binary builds as printed and runs"
    # Where Debian's python3 looks under /usr/local (and /usr): the README installs there.
    if [[ -d $build/python/xla_spawn ]]; then
      /usr/bin/python3 -c "import site, sys; sys.exit('/usr/local/$site' not in site.getsitepackages())" ||
        fail "Debian's python3 does not read /usr/local/$site, where the package installs"
    fi
    run_python "$prefix" "$prefix/$site" install
    ;;
  deb)
    deb=$build/xla-spawn_${version}_amd64.deb
    python_deb=$build/python3-xla-spawn_${version}_amd64.deb
    rm -f "$deb" "$python_deb"
    XS_BUILD_DIR=$build "$source/scripts/package" >"$scratch/package.log" 2>&1 ||
      { cat "$scratch/package.log" >&2; fail "scripts/package failed"; }
    [[ -f $deb ]] || fail "scripts/package wrote no $(basename "$deb")"
    check_depends "$deb"
    if [[ -d $build/python/xla_spawn ]]; then
      [[ -f $python_deb ]] || fail "scripts/package wrote no $(basename "$python_deb")"
      check_depends "$python_deb"
      minor=$(/usr/bin/python3 -c 'import sys; print(sys.version_info.minor)')
      dpkg-deb -f "$python_deb" Depends | grep -qF "python3 (<< 3.$((minor + 1)))" ||
        fail "python3-xla-spawn does not pin the Python 3.$minor its extension is built for"
    fi
    root=$scratch/root
    dpkg-deb -x "$deb" "$root"
    [[ ! -f $python_deb ]] || dpkg-deb -x "$python_deb" "$root"
    check_version "$root/usr"
    man_page=$root/usr/share/man/man1/xla-spawn.1
    [[ -f $man_page ]] || fail "no man page at usr/share/man/man1/xla-spawn.1"
    warnings=$(groff -man -Tutf8 -ww -z "$man_page" 2>&1)
    [[ -z $warnings ]] || fail "the man page renders with warnings: $warnings"
    # The OPTIONS section alone: other sections mention options too.
    options_text=$(MANWIDTH=100 man -l "$man_page" 2>/dev/null | sed -n '/^OPTIONS/,/^[A-Z]/p')
    listed=0
    for option in $(help_options "$root/usr/bin/xla-spawn"); do
      grep -qE -- "^ +(-[a-z], )?$option( |$)" <<<"$options_text" ||
        fail "the man page's OPTIONS do not list $option"
      listed=$((listed + 1))
    done
    ((listed >= 15)) || fail "only $listed options found in --help"
    [[ -f $root/usr/share/bash-completion/completions/xla-spawn ]] || fail "no bash completion"
    build_and_run "$root/usr" deb
    run_python "$root/usr" "$root/usr/$site" deb
    ;;
  completion)
    # shellcheck disable=SC1091
    source "$build/xla-spawn.bash-completion"
    handed=""
    _command_offset() { handed=$1; }  # bash-completion's, which completes the command
    complete_at() {
      COMP_WORDS=("$@")
      COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
      COMPREPLY=()
      handed=""
      _xla_spawn
    }
    complete_at xla-spawn --no-b
    [[ ${COMPREPLY[*]} == --no-bind-cores ]] || fail "--no-b offered '${COMPREPLY[*]}'"
    complete_at xla-spawn --max
    [[ ${COMPREPLY[*]} == --max-restarts ]] || fail "--max offered '${COMPREPLY[*]}'"
    mkdir -p "$scratch/logs-here"
    complete_at xla-spawn --log-dir "$scratch/logs-"
    [[ ${COMPREPLY[*]} == "$scratch/logs-here" ]] || fail "--log-dir offered '${COMPREPLY[*]}'"
    touch "$scratch/trace-old.json"
    complete_at xla-spawn --trace "$scratch/trace-"
    [[ ${COMPREPLY[*]} == "$scratch/trace-old.json" ]] || fail "--trace offered '${COMPREPLY[*]}'"
    complete_at xla-spawn -n 2 ./train --ep
    [[ $handed == 3 ]] || fail "the command after '-n 2' was not handed over (got '$handed')"
    complete_at xla-spawn --timestamp -- ./train -n
    [[ $handed == 3 ]] || fail "the command after '--' was not handed over (got '$handed')"
    complete_at xla-spawn --nprocs = 4 ./train --ep  # as bash splits --nprocs=4
    [[ $handed == 4 ]] || fail "the command after '--nprocs=4' was not handed over (got '$handed')"
    mkdir -p "$scratch/my logs"
    complete_at xla-spawn --log-dir = "$scratch/my"
    [[ ${#COMPREPLY[@]} == 1 && ${COMPREPLY[0]} == "$scratch/my logs" ]] ||
      fail "--log-dir=DIR with a space offered ${#COMPREPLY[@]} word(s): '${COMPREPLY[*]}'"
    # Without bash-completion: command names, then file names.
    unset -f _command_offset
    complete_at xla-spawn -n 2 bas
    [[ " ${COMPREPLY[*]} " == *" bash "* ]] || fail "'bas' as the command did not offer bash"
    complete_at xla-spawn -n 2 ./train "$scratch/logs-"
    [[ ${COMPREPLY[*]} == "$scratch/logs-here" ]] || fail "an argument of the command offered '${COMPREPLY[*]}'"
    for option in $(help_options "$build/launcher/xla-spawn"); do
      complete_at xla-spawn "$option"
      [[ " ${COMPREPLY[*]} " == *" $option "* ]] || fail "$option is not offered"
    done
    echo "package_test: completion offers every option of --help"
    ;;
  *) fail "unknown mode '$mode' (install, deb or completion)" ;;
esac
