#!/usr/bin/env bash
# Creates .mtvenv (Python 3.12 with maxtext==0.2.5 and its pinned CPU dependencies) in the repository root for
# integration_tests/maxtext_interop/run_interop.py, from requirements-maxtext.txt. Does nothing when the venv is
# current (a hash stamp of the requirements file and the interpreter version lives in .mtvenv); rebuilds it when
# missing or stale, with uv where it installs (tools/install_requirements.sh; else pip). About a minute on a
# new machine (wheels only).
#
# Interpreter: $HF2MAXTEXT_MAXTEXT_BASE_PYTHON, else ~/.pyenv/versions/3.12.1/bin/python, else python3.12 on PATH.
# Prints the venv's python path on stdout when done.

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)"
VENV="${HF2MAXTEXT_MTVENV:-$ROOT/.mtvenv}"
REQ="$ROOT/integration_tests/maxtext_interop/requirements-maxtext.txt"
STAMP="$VENV/.hf2maxtext-maxtext-requirements.sha256"

# shellcheck source=tools/install_requirements.sh
source "$ROOT/tools/install_requirements.sh"

say() { printf 'setup_venv.sh: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

[[ -f "$REQ" ]] || die "$REQ is missing"

find_python() {
  local cand
  for cand in "${HF2MAXTEXT_MAXTEXT_BASE_PYTHON:-}" "$HOME/.pyenv/versions/3.12.1/bin/python" \
      "$(command -v python3.12 2>/dev/null || true)"; do
    [[ -n "$cand" && -x "$cand" ]] || continue
    if "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
      echo "$cand"
      return 0
    fi
  done
  return 1
}

PY="$(find_python)" || die "no Python 3.12 found (tried \$HF2MAXTEXT_MAXTEXT_BASE_PYTHON, ~/.pyenv/versions/3.12.1/bin/python,
python3.12 on PATH). MaxText 0.2.5 needs Python 3.12: install one (e.g. 'pyenv install 3.12.1') or point
HF2MAXTEXT_MAXTEXT_BASE_PYTHON at it."

want="$( { sha256sum <"$REQ"; "$PY" -c 'import sys; print(sys.version)'; } | sha256sum | cut -d' ' -f1)"

if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
  echo "$VENV/bin/python"
  exit 0
fi

build() {
  # Re-check under the lock: another run may have built it meanwhile.
  if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
    return 0
  fi
  local start=$SECONDS
  say "building $VENV with $PY from ${REQ#"$ROOT/"} (about a minute)"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV" >&2
  # maxtext declares no base dependencies; the file pins the complete set, so no resolution is wanted.
  local log
  log="$(mktemp)"
  if ! install_requirements "$VENV/bin/python" --no-deps -r "$REQ" 2>"$log"; then
    tail -n 30 "$log" >&2
    rm -rf "$VENV" "$log"
    die "pip install from $REQ failed (last lines above)"
  fi
  rm -f "$log"
  # tunix: MaxText's Tunix-based trainer (train_sft) imports it, and its __init__ everything it needs.
  "$VENV/bin/python" -c 'import maxtext, jax, flax, orbax.checkpoint, tunix' >&2 \
    || { rm -rf "$VENV"; die "the new venv cannot import maxtext and tunix"; }
  echo "$want" >"$STAMP"
  say "$VENV ready in $((SECONDS - start))s"
}

if command -v flock >/dev/null 2>&1; then
  # One builder at a time (two checks started together); the lock lies beside the venv (ignored by git), so that
  # a clone, removed, leaves none behind in /tmp.
  exec 9>"$VENV.lock"
  flock 9
  build
  flock -u 9
  exec 9>&-
else
  build
fi
echo "$VENV/bin/python"
