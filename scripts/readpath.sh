#!/bin/sh
# readpath.sh: which of the root package's files and functions one steady
# replica read runs code in. TestSteadyRead runs with one, two and three
# steady reads under coverage (fake servers, no real PostgreSQL); the
# blocks whose counts grow with each read added are a steady read's (a
# block run once or not at all by a branch on the clock in the first,
# checked, read cannot grow twice), and TestReadPathFiles lists them and
# holds the file count to its bound.
set -eu
cd "$(dirname "$0")/.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for n in 1 2 3; do
	PGRYW_STEADY_READS=$n ${GO:-go} test -count=1 -covermode=count -coverpkg=github.com/pgryw/pgryw \
		-coverprofile="$dir/$n.out" -run '^TestSteadyRead$' . >/dev/null
done
rc=0
PGRYW_READPATH_PROFILES="$dir/1.out,$dir/2.out,$dir/3.out" ${GO:-go} test -count=1 -v -run '^TestReadPathFiles$' . >"$dir/report" 2>&1 || rc=$?
grep -E 'readpath_test|^(--- |ok|FAIL)' "$dir/report" || cat "$dir/report"
exit $rc
