#!/usr/bin/env bash
# One entry point for a fresh machine with only Python 3.11 and pip:
#   bash dev.sh demo   - create/reuse .venv, install the light core, run the main job
#   bash dev.sh demo app - the same with the app extra, and start the what-if dashboard (costline app)
#   bash dev.sh test   - create/reuse .venv, install CPU torch + triton + test deps, run the whole suite
#                        on every core (pytest-xdist, one test file per worker at a time, the heaviest files
#                        first: conftest.py orders them by tests/file_seconds.txt; -n 0 runs serially)
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY=.venv/bin/python
stamp() { echo "$1-$(sha1sum < pyproject.toml | cut -c1-12)"; }
install() {  # install once per pyproject version and extras set
  local want; want=$(stamp "$1")
  if [ "$(cat .venv/.costline-installed-"$1" 2>/dev/null)" != "$want" ]; then
    $VPY -m pip install -q --upgrade pip
    if [ "$1" = test ]; then
      # CPU build of torch first (on disk here; a plain `torch` would pull a CUDA build). pip byte-compiles
      # one file at a time (~26 s of a fresh install on the 2-core machine): compileall on every core
      # does it in half. Compiled it must be: with PYTHONDONTWRITEBYTECODE set (as on these machines)
      # every test process would compile what it imports again (~2 s each, ~1 CPU minute a suite).
      $VPY -m pip install -q --no-compile "torch==2.13.0" ||
        $VPY -m pip install -q --no-compile torch --index-url https://download.pytorch.org/whl/cpu
      $VPY -m pip install -q --no-compile -e ".[engine,test]"
      # some packages ship files that are not meant to compile: their errors are not ours
      $VPY -m compileall -q -j 0 "$($VPY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
        >/dev/null 2>&1 || true
    elif [ "$1" = app ]; then
      $VPY -m pip install -q -e ".[app]"
    else
      $VPY -m pip install -q -e .
    fi
    echo "$want" > .venv/.costline-installed-"$1"
  fi
}
case "${1:-demo}" in
  demo)
    if [ "${2:-}" = app ]; then install app; shift 2; exec .venv/bin/costline app "$@"; fi
    install core; shift || true; exec .venv/bin/costline "${@:-demo}" ;;
  test) install test; shift || true
    # Byte-code caches on for the suite, even where PYTHONDONTWRITEBYTECODE is set (as on these machines):
    # else every worker and every process a test starts compiles our modules again, and pytest rewrites
    # the asserts of every test module again (~11 s a worker, each run). __pycache__/ is gitignored.
    unset PYTHONDONTWRITEBYTECODE
    TRITON_INTERPRET=1 exec $VPY -m pytest -n auto --dist loadfile --no-loadscope-reorder "$@" ;;
  *) echo "usage: bash dev.sh demo|test [args]" >&2; exit 2 ;;
esac
