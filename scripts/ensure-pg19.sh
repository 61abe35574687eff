#!/usr/bin/env bash
# Prints the bin dir of a PostgreSQL 19 server (the first with WAIT FOR LSN),
# building it once per machine from the source snapshot in ../shared/pg19
# (about 5 minutes on 2 cores; later calls return at once). PG19_BINDIR
# overrides the lookup.
set -euo pipefail
if [ -n "${PG19_BINDIR:-}" ]; then echo "$PG19_BINDIR"; exit 0; fi
root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/../shared/pg19/build.sh"
if [ ! -f "$build" ]; then
  echo "ensure-pg19: $build not found (the shared/ folder beside the checkout)" >&2
  exit 1
fi
# Called from make, MAKELEVEL and MAKEFLAGS would reach PostgreSQL's own
# make, which generates its headers only as a top-level make: without them
# the build fails (utils/errcodes.h not found).
bindir=$(env -u MAKELEVEL -u MAKEFLAGS -u MFLAGS bash "$build" | tail -1)
# The servers run as the postgres user when the tests run as root.
chmod -R a+rX "$(dirname "$bindir")" 2>/dev/null || true
echo "$bindir"
