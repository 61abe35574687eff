#!/usr/bin/env bash
# Makes sure PostgreSQL server binaries (initdb, pg_ctl, postgres,
# pg_basebackup) are on this machine, installing Debian's package when root.
# The tests find them through PGRYW_PG_BINDIR, /usr/lib/postgresql/*/bin or PATH.
set -euo pipefail

have_server() {
  if [ -n "${PGRYW_PG_BINDIR:-}" ] && [ -x "$PGRYW_PG_BINDIR/initdb" ]; then return 0; fi
  for d in /usr/lib/postgresql/*/bin; do
    [ -x "$d/initdb" ] && [ -x "$d/pg_basebackup" ] && return 0
  done
  command -v initdb >/dev/null 2>&1 && command -v pg_basebackup >/dev/null 2>&1
}

if have_server; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "PostgreSQL server binaries not found. Install them with:" >&2
  echo "  sudo apt-get install -y postgresql" >&2
  echo "or point PGRYW_PG_BINDIR at a directory holding initdb, pg_ctl, postgres and pg_basebackup." >&2
  exit 1
fi
echo "Installing PostgreSQL server binaries (apt-get install -y postgresql)..." >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
# The package's own service is not needed: the tests start their own servers.
apt-get install -y -q --no-install-recommends postgresql >/dev/null
have_server || { echo "postgresql installed but no server binaries found" >&2; exit 1; }
