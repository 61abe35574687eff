package sqlclass

import (
	"regexp"
	"strings"
)

// What a block of procedural code (a DO block, or the body of a function a
// statement calls) may do to the session, read from its text. Text cannot
// show everything: a call to another function, dynamic SQL (EXECUTE) and
// languages other than SQL and PL/pgSQL hide it. The reading errs towards
// "touches": a false match costs a read-back of the session's state behind
// the statement, a missed one a setting that replicas do not get.

var (
	bodySetConfig    = regexp.MustCompile(`(?i)\bset_config\s*\(\s*('(?:[^']|'')*'|)`)
	bodySet          = regexp.MustCompile(`(?i)(?:^|[;\s(])SET\s+(?:SESSION\s+)?(ROLE\b|AUTHORIZATION\b|"(?:[^"]|"")+"|[a-z_][a-z0-9_$]*(?:\.[a-z_][a-z0-9_$]*)?)`)
	bodyAdvisory     = regexp.MustCompile(`(?i)\bpg_(?:try_)?advisory_(?:lock|unlock)(?:_shared|_all)?\b`)
	bodyTemp         = regexp.MustCompile(`(?i)\bCREATE\s+(?:(?:GLOBAL|LOCAL)\s+)?TEMP(?:ORARY)?\b|\bDROP\s+TABLE\b`)
	bodyListen       = regexp.MustCompile(`(?i)\b(?:UN)?LISTEN\b`)
	bodyPrepare      = regexp.MustCompile(`(?i)\b(?:PREPARE|DEALLOCATE)\b`)
	bodyHold         = regexp.MustCompile(`(?i)\bWITH\s+HOLD\b`)
	bodyDynamic      = regexp.MustCompile(`(?i)\bEXECUTE\b`)
	bodyNotSettings  = map[string]bool{"local": true, "transaction": true, "constraints": true, "session": true, "schema": true}
	bodyRoleSettings = map[string]string{"role": "role", "authorization": "session_authorization"}
)

// BodyEffects reads the session state a block of SQL or PL/pgSQL code may
// touch: the kinds, and the run-time parameters it sets by a literal name
// (lower-cased as the server folds them). Dynamic SQL, and set_config with
// a name that is not a literal, give StateUntracked.
func BodyEffects(body string) (State, []string) {
	var st State
	var names []string
	add := func(n string) {
		st |= StateSettings
		if !contains(names, n) {
			names = append(names, n)
		}
	}
	for _, m := range bodySetConfig.FindAllStringSubmatch(body, -1) {
		if lit := m[1]; len(lit) >= 2 {
			add(strings.ToLower(strings.ReplaceAll(lit[1:len(lit)-1], "''", "'")))
		} else {
			st |= StateUntracked
		}
	}
	for _, m := range bodySet.FindAllStringSubmatch(body, -1) {
		n := m[1]
		if strings.HasPrefix(n, `"`) {
			add(strings.ReplaceAll(n[1:len(n)-1], `""`, `"`))
			continue
		}
		n = strings.ToLower(n)
		if r, ok := bodyRoleSettings[n]; ok {
			add(r)
		} else if !bodyNotSettings[n] {
			add(n)
		}
	}
	if bodyAdvisory.MatchString(body) {
		st |= StateLock
	}
	if bodyTemp.MatchString(body) {
		st |= StateTemp
	}
	if bodyListen.MatchString(body) {
		st |= StateListen
	}
	if bodyPrepare.MatchString(body) {
		st |= StatePrepared
	}
	if bodyHold.MatchString(body) {
		st |= StateCursor
	}
	if bodyDynamic.MatchString(body) {
		st |= StateUntracked
	}
	return st, names
}
