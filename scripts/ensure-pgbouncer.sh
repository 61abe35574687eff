#!/usr/bin/env bash
# Makes sure a pgbouncer binary is on this machine, installing Debian's
# package when root. The tests start their own, one per node, on loopback;
# the package's own service is stopped and disabled.
set -euo pipefail

have() { command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ]; }

if have; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "pgbouncer not found. Install it with:" >&2
  echo "  sudo apt-get install -y pgbouncer" >&2
  exit 1
fi
echo "Installing PgBouncer (apt-get install -y pgbouncer)..." >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends pgbouncer >/dev/null
if command -v systemctl >/dev/null 2>&1; then
  systemctl disable --now pgbouncer >/dev/null 2>&1 || true
fi
have || { echo "pgbouncer installed but not found" >&2; exit 1; }
