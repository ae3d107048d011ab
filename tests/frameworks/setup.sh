#!/usr/bin/env bash
# Installs the job frameworks that killtest.py drives:
# - Python (rq, Celery, hotqueue): a venv in tests/frameworks/venv with the
#   exact versions of requirements.txt; reinstalled only when
#   requirements.txt is newer than the venv's stamp file.
# - Node (bee-queue, bull): `npm ci` in tests/frameworks/node, when it has a
#   lock file newer than what npm last installed there.
# - Ruby (sidekiq): Debian's ruby-sidekiq, when tests/frameworks/ruby exists
#   and ruby cannot load sidekiq.
# Prints nothing and changes nothing when all of it is present.
set -euo pipefail
export PATH="$PATH:/usr/sbin:/usr/local/sbin"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

sudo=()
if [ "$(id -u)" -ne 0 ]; then sudo=(sudo env DEBIAN_FRONTEND=noninteractive); fi
export DEBIAN_FRONTEND=noninteractive
apt_updated=0
apt_install() {
  echo "frameworks/setup: installing $* (apt-get)" >&2
  if [ "$apt_updated" -eq 0 ]; then
    "${sudo[@]}" apt-get update -qq </dev/null
    apt_updated=1
  fi
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "$@" </dev/null >/dev/null
}

python_frameworks() {
  local venv="$here/venv" stamp="$here/venv/.requirements-installed"
  if [ -x "$venv/bin/python" ] && [ ! "$here/requirements.txt" -nt "$stamp" ]; then
    return 0
  fi
  command -v python3 >/dev/null 2>&1 || apt_install python3
  if [ ! -x "$venv/bin/python" ]; then
    echo "frameworks/setup: creating tests/frameworks/venv" >&2
    # Debian ships venv's pip bootstrap (ensurepip) separately.
    if ! python3 -m venv "$venv" >/dev/null 2>&1; then
      rm -rf "$venv"
      apt_install python3-venv
      python3 -m venv "$venv"
    fi
  fi
  echo "frameworks/setup: installing tests/frameworks/requirements.txt (pip)" >&2
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$here/requirements.txt" >&2
  touch "$stamp"
}
python_frameworks

node_frameworks() {
  local dir="$here/node"
  [ -f "$dir/package-lock.json" ] || return 0
  # npm ci records what it installed in node_modules/.package-lock.json.
  [ "$dir/package-lock.json" -nt "$dir/node_modules/.package-lock.json" ] || return 0
  if ! command -v npm >/dev/null 2>&1; then
    echo "frameworks/setup: npm not found: the node frameworks cannot run (install Node.js 20 or later)" >&2
    return 0
  fi
  echo "frameworks/setup: installing tests/frameworks/node (npm ci)" >&2
  npm ci --prefix "$dir" --no-audit --no-fund --loglevel=error >/dev/null
}
node_frameworks

ruby_frameworks() {
  [ -d "$here/ruby" ] || return 0
  ruby -e 'require "sidekiq"' >/dev/null 2>&1 && return 0
  apt_install ruby-sidekiq
  ruby -e 'require "sidekiq"' >/dev/null 2>&1 || {
    echo "frameworks/setup: ruby still cannot load sidekiq" >&2
    return 1
  }
}
ruby_frameworks
