#!/usr/bin/env bash
# pg-version.sh BINDIR WHAT: prints which PostgreSQL server a test run uses.
# An empty BINDIR means the one the tests find by themselves
# ($PGRYW_PG_BINDIR, else the newest /usr/lib/postgresql/*/bin, else PATH).
set -euo pipefail
bindir=${1:-${PGRYW_PG_BINDIR:-}}
if [ -z "$bindir" ]; then
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V); do bindir=$d; done
fi
if [ -z "$bindir" ] && command -v postgres >/dev/null; then bindir=$(dirname "$(readlink -f "$(command -v postgres)")"); fi
echo "== $("$bindir/postgres" --version) ($bindir): ${2:-}"
