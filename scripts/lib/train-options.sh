# shellcheck shell=bash
# Sourced by the demos. train_options DEFAULTS... -- USER_ARGS...: prints (one per line) each
# option/value pair of DEFAULTS that USER_ARGS do not give themselves (as "--opt v" or
# "--opt=v"), then USER_ARGS: train_fmnist refuses an option given twice, so a caller's
# "--epochs 3" replaces the demo's "--epochs 1" instead of failing.
#   mapfile -t args < <(train_options --epochs 1 --lr 1e-3 -- "$@")
train_options() {
  local defaults=() given a i keep
  while (($# > 0)) && [[ $1 != -- ]]; do defaults+=("$1"); shift; done
  (($# > 0)) && shift
  for ((i = 0; i + 1 < ${#defaults[@]}; i += 2)); do
    keep=1
    for given in "$@"; do
      if [[ $given == "${defaults[i]}" || $given == "${defaults[i]}="* ]]; then keep=0; fi
    done
    if ((keep)); then printf '%s\n%s\n' "${defaults[i]}" "${defaults[i + 1]}"; fi
  done
  for a in "$@"; do printf '%s\n' "$a"; done
}
