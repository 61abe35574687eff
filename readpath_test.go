package pgryw_test

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/pgryw/pgryw"
)

// TestSteadyRead runs reads on a replica known to have replayed the
// watermark, with nothing pending (after one checked read): each is one
// flush of pgx's own messages. PGRYW_STEADY_READS sets how many (1 unless
// set): scripts/readpath.sh runs it with 1 and 2 under -coverprofile, and
// the blocks whose counts differ are what one steady read runs
// (TestReadPathFiles).
func TestSteadyRead(t *testing.T) {
	n := 1
	if v := os.Getenv("PGRYW_STEADY_READS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			t.Fatalf("PGRYW_STEADY_READS=%q", v)
		}
	}
	pc := newProtoCluster(t, "15.4", "")
	pgryw.StopMonitor(pc.c) // nothing of the monitor's in the counters
	warmReplica(t, pc)
	pc.r.replays(protoLSN)
	read := func(want []string) {
		t.Helper()
		before := len(flushes(pc.replica, false))
		var v string
		if err := pc.db.QueryRow(protoRead, 7).Scan(&v); err != nil || v != "new" {
			t.Fatalf("read: %q, %v", v, err)
		}
		fs := flushes(pc.replica, false)[before:]
		if len(fs) != 1 || !reflect.DeepEqual(fs[0].msgs, want) {
			t.Fatalf("read: replica flushes %v, want one %q", fs, want)
		}
	}
	read(cat(parseCheck, checkMsgs, readExec)) // checked once
	read(readExec)
	for i := 0; i < n; i++ {
		read(readExec)
	}
}

// maxReadPathFiles is how many of the root package's files one steady
// replica read may run code in: a ratchet at what it is (conn, classify,
// plan, replica and attempt, watermark, topology and node, backend,
// observe), so that a new file on the path is a decision.
const maxReadPathFiles = 10

// TestReadPathFiles compares three coverage profiles of TestSteadyRead
// (PGRYW_READPATH_PROFILES=one,two,three, written by scripts/readpath.sh):
// the root files and functions whose counts grow with each read added are
// what one steady read runs, and the files are at most
// maxReadPathFiles.
func TestReadPathFiles(t *testing.T) {
	profiles := strings.Split(os.Getenv("PGRYW_READPATH_PROFILES"), ",")
	if len(profiles) != 3 {
		t.Skip("scripts/readpath.sh sets PGRYW_READPATH_PROFILES")
	}
	files, funcs := readPath(t, counts(t, profiles[0]), counts(t, profiles[1]), counts(t, profiles[2]))
	t.Logf("one steady replica read runs code in %d root files: %s", len(files), strings.Join(files, " "))
	t.Logf("and %d functions: %s", len(funcs), strings.Join(funcs, " "))
	if len(files) > maxReadPathFiles {
		t.Errorf("%d files, want at most %d", len(files), maxReadPathFiles)
	}
}

// counts reads a coverage profile's counts of the root package's blocks
// ("conn.go:12.34,15.2").
func counts(t *testing.T, profile string) map[string]int {
	t.Helper()
	f, err := os.Open(profile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	counts := map[string]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// github.com/pgryw/pgryw/conn.go:12.34,15.2 3 1
		name, ok := strings.CutPrefix(sc.Text(), "github.com/pgryw/pgryw/")
		fields := strings.Fields(name)
		if !ok || len(fields) != 3 || strings.Contains(fields[0], "/") {
			continue
		}
		n, _ := strconv.Atoi(fields[2])
		counts[fields[0]] += n
	}
	return counts
}

// readPath lists the root package's files, and the functions in them,
// with a block counted more often with each steady read added (one, two,
// three): a block run once or not at all by a branch on the clock in the
// first, checked, read cannot grow twice.
func readPath(t *testing.T, one, two, three map[string]int) (files, funcs []string) {
	t.Helper()
	lines := map[string][]int{} // file -> first lines of counted blocks
	for block, n := range two {
		if n <= one[block] || three[block] <= n {
			continue
		}
		base, pos, _ := strings.Cut(block, ":")
		start, _, _ := strings.Cut(pos, ".")
		l, _ := strconv.Atoi(start)
		lines[base] = append(lines[base], l)
	}
	fs := token.NewFileSet()
	seen := map[string]bool{}
	for base, ls := range lines {
		files = append(files, base)
		af, err := parser.ParseFile(fs, base, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}
			a, b := fs.Position(fd.Pos()).Line, fs.Position(fd.End()).Line
			for _, l := range ls {
				if l >= a && l <= b && !seen[base+fd.Name.Name] {
					seen[base+fd.Name.Name] = true
					funcs = append(funcs, fmt.Sprintf("%s:%s", strings.TrimSuffix(base, ".go"), fd.Name.Name))
				}
			}
		}
	}
	sort.Strings(files)
	sort.Strings(funcs)
	return files, funcs
}
