# Sourced by tools/bazel and integration_tests/maxtext_interop/setup_venv.sh: installs requirement files into a
# virtual environment with uv (pinned below), falling back to pip where uv cannot be installed.
#
# Why uv: on a new machine (no pip cache) pip resolves one package at a time, a round trip to the index each,
# and spends most of a .venv build waiting on them (docs/testing.md has the figures); uv asks for them all at once.
# uv reads none of pip's configuration, so the index, extra indexes, find-links, constraints and certificate pip
# would use (its config files and PIP_* variables, as `pip config list` shows them) are handed to uv, and both
# pick the same wheels: the local CPU build of torch from find-links, for one. Bytecode is compiled at install, as
# pip does and uv does not by default: with PYTHONDONTWRITEBYTECODE set, every process would compile its imports.

UV_REQUIREMENT="uv==0.13.10"

# pip_setting PYTHON KEY: the value pip uses for KEY (`index-url`, ...): its PIP_* variable, else its config files.
pip_setting() {
  local python="$1" key="$2" listing
  listing="$("$python" -m pip config list 2>/dev/null)" || return 0
  local from_env from_file
  from_env="$(sed -n "s/^:env:\.$key='\(.*\)'$/\1/p" <<<"$listing" | head -n 1)"
  from_file="$(sed -n "s/^[a-z]*\.$key='\(.*\)'$/\1/p" <<<"$listing" | head -n 1)"
  printf '%s' "${from_env:-$from_file}"
}

# install_requirements PYTHON [INSTALL ARGS...]: `pip install ARGS` into PYTHON's environment, through uv when
# it can be installed there. Output goes to stderr.
install_requirements() {
  local python="$1"
  shift
  local venv_bin uv
  venv_bin="$(dirname "$python")"
  uv="$venv_bin/uv"
  if [[ ! -x "$uv" ]] && ! "$python" -m pip install --disable-pip-version-check -q "$UV_REQUIREMENT" >&2; then
    printf 'install_requirements: %s could not be installed; installing with pip\n' "$UV_REQUIREMENT" >&2
    "$python" -m pip install --disable-pip-version-check "$@" >&2
    return
  fi
  local uv_args=(pip install --python "$python" --index-strategy unsafe-best-match --compile-bytecode) value link
  value="$(pip_setting "$python" index-url)"
  [[ -n "$value" ]] && uv_args+=(--default-index "$value")
  for link in $(pip_setting "$python" extra-index-url); do
    # A file:// index that is not there: pip warns and goes on; uv would fail.
    [[ "$link" == file://* && ! -d "${link#file://}" ]] && continue
    uv_args+=(--index "$link")
  done
  for link in $(pip_setting "$python" find-links); do
    uv_args+=(--find-links "$link")
  done
  for value in $(pip_setting "$python" constraint); do
    [[ -f "$value" ]] && uv_args+=(--constraint "$value")
  done
  local env=(UV_LINK_MODE=copy)
  value="${SSL_CERT_FILE:-$(pip_setting "$python" cert)}"
  [[ -n "$value" ]] && env+=(SSL_CERT_FILE="$value")
  if ! env "${env[@]}" "$uv" "${uv_args[@]}" "$@" >&2; then
    printf 'install_requirements: uv failed (above); installing with pip\n' >&2
    "$python" -m pip install --disable-pip-version-check "$@" >&2
  fi
}
