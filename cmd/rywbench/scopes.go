package main

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
)

// Cluster scopes of the pgryw strategies.
//
// pgryw gives every connector of a process that names the same writer
// address and database one cluster scope: one pool-wide watermark, one
// capture=auto state (see pgryw's driver.go, scopeOf). Strategies run in
// one rywbench process would share it, and a write-only loop would keep
// the captures that another strategy's reads ask for, a read-only pool
// wait for another's writes. On a local cluster each pgryw strategy with
// replicas therefore names the writer by an address of its own, one of
// the loopback addresses 127.0.0.2, 127.0.0.3, … that the servers also
// listen on (Linux routes all of 127.0.0.0/8 to the loopback interface;
// the connections still come from 127.0.0.1). Where such an address
// cannot be bound, the strategies left without one share 127.0.0.1, and
// the target lines that need a pool alone say so (scopeSharers).

// loopbackWriter is the local cluster's writer address (pgtest).
const loopbackWriter = "127.0.0.1"

// scopedKinds returns the pgryw strategies among names whose pools read
// from replicas, in order: those whose watermarks would meet in one scope.
func scopedKinds(names []string) []string {
	var out []string
	for _, k := range names {
		if slices.Contains(pgrywKinds, k) && k != pgrywNoReplica && k != poolNoReplica && !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out
}

// scopeHosts assigns each of kinds a writer address: the first gets
// 127.0.0.1, the next ones 127.0.0.2 and on, as far as bindable says
// such an address can be listened on; the rest get 127.0.0.1 too. It
// returns the assignment and the addresses the servers must listen on.
func scopeHosts(kinds []string, bindable func(string) bool) (map[string]string, []string) {
	hosts := []string{loopbackWriter}
	for i := 1; i < len(kinds) && i < 254; i++ {
		h := fmt.Sprintf("127.0.0.%d", i+1)
		if !bindable(h) {
			break
		}
		hosts = append(hosts, h)
	}
	by := map[string]string{}
	for i, k := range kinds {
		by[k] = loopbackWriter
		if i < len(hosts) {
			by[k] = hosts[i]
		}
	}
	return by, hosts
}

// canListen reports whether a TCP socket can be bound to host.
func canListen(host string) bool {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// listenLine is the postgresql.conf line that makes the servers listen on
// hosts.
func listenLine(hosts []string) string {
	return "listen_addresses = '" + strings.Join(hosts, ",") + "'"
}

// pgrywDSN is the writer DSN kind's pgryw pool opens: the local cluster's
// with the writer named by kind's address (scopeHosts), else the
// writer's DSN as it is.
func (e *env) pgrywDSN(kind string) string {
	h := e.scopeHost[kind]
	if h == "" || h == loopbackWriter {
		return e.primaryDSN
	}
	u, err := url.Parse(e.primaryDSN)
	if err != nil || u.Hostname() != loopbackWriter {
		return e.primaryDSN
	}
	u.Host = net.JoinHostPort(h, u.Port())
	return u.String()
}

// scopeSharers returns the run's other pgryw strategies with replicas
// whose pools named the writer as kind's did: the process gives them one
// cluster scope, whose watermark and capture=auto state kind's figures
// then carry. A write-only loop keeps a capture after another's read
// (which counts as a use of the watermark, or, finding a position lost,
// pauses capture=auto's skipping for a second), and a read-only pool
// waits for the others' writes. A pool without replicas captures nothing
// and reads no watermark.
func scopeSharers(by map[string]summary, kind string) []string {
	var out []string
	for _, k := range pgrywKinds {
		if s, ok := by[k]; ok && k != kind && k != pgrywNoReplica && k != poolNoReplica && s.Scope == by[kind].Scope {
			out = append(out, k)
		}
	}
	return out
}
