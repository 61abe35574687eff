package sqlclass

import "strings"

// probeFuncs are the built-in functions NodeProbe admits: they take no
// argument and answer what the server is (its address, its role, its WAL
// position, when it started) as of the call, the same inside a transaction
// as outside it.
var probeFuncs = map[string]bool{
	"pg_is_in_recovery": true, "inet_server_addr": true, "inet_server_port": true, "pg_backend_pid": true,
	"pg_postmaster_start_time": true, "pg_conf_load_time": true,
	"pg_current_wal_lsn": true, "pg_current_wal_insert_lsn": true, "pg_current_wal_flush_lsn": true,
	"pg_last_wal_replay_lsn": true, "pg_last_wal_receive_lsn": true, "pg_last_xact_replay_timestamp": true,
	"pg_is_wal_replay_paused": true, "pg_get_wal_replay_pause_state": true,
}

// NodeProbe reports whether sql reads node identity alone, in a form whose
// answer no transaction changes: a session outside a transaction gets the
// answer a session inside it would. Only two shapes qualify, so that the
// answer is sure:
//
//   - SHOW of a setting that says what the node is (port, in_hot_standby,
//     listen_addresses...), not of a transaction_* one;
//   - SELECT of a list of calls, each an argument-less built-in of
//     probeFuncs (pg_is_in_recovery(), inet_server_port(),
//     pg_current_wal_lsn()...) or current_setting('name') of such a
//     setting, each with an optional cast (::type) and alias, optionally
//     qualified by pg_catalog, with no FROM, no operator, no other
//     function.
//
// Each such SELECT returns one row, and an error in it (a cast that fails)
// comes with that row.
func NodeProbe(sql string) bool {
	var buf [64]stok
	c := classifier{src: sql}
	ts := c.lex(buf[:0], false)
	if c.bad != "" || c.plainBackslash {
		return false
	}
	if n := len(ts); n > 0 && ts[n-1].kind == TokSemicolon {
		ts = ts[:n-1]
	}
	if len(ts) < 2 || ts[0].kind != TokIdent {
		return false
	}
	switch ts[0].kw {
	case kwShow:
		return len(ts) == 2 && ts[1].kind == TokIdent && probeSetting(asciiLower(c.text(ts[1])))
	case kwSelect:
	default:
		return false
	}
	for i := 1; ; {
		j, ok := c.probeCall(ts, i)
		if !ok {
			return false
		}
		if kindAt(ts, j) == TokTypecast {
			// A built-in type: a cast to a domain or through a cast
			// function of the database's runs its code.
			if kindAt(ts, j+1) != TokIdent || !probeTypes[asciiLower(c.text(ts[j+1]))] {
				return false
			}
			j += 2
		}
		if keywordAt(ts, j) == kwAs {
			j++
			if !isName(stokAt(ts, j)) {
				return false
			}
			j++
		} else if kindAt(ts, j) == TokQuotedIdent || kindAt(ts, j) == TokIdent && ts[j].kw == noKeyword {
			j++ // an alias without AS
		}
		switch {
		case j == len(ts):
			return true
		case ts[j].kind != TokComma:
			return false
		}
		i = j + 1
	}
}

// probeCall reads one admitted call starting at ts[i] and returns the
// index after it.
func (c *classifier) probeCall(ts []stok, i int) (int, bool) {
	if kindAt(ts, i) == TokIdent && kindAt(ts, i+1) == TokDot && asciiEqualFold(c.text(ts[i]), "pg_catalog") {
		i += 2
	}
	if kindAt(ts, i) != TokIdent || kindAt(ts, i+1) != TokLParen {
		return 0, false
	}
	name := asciiLower(c.text(ts[i]))
	switch {
	case probeFuncs[name] && kindAt(ts, i+2) == TokRParen:
		return i + 3, true
	case name == "current_setting" && kindAt(ts, i+3) == TokRParen && probeSetting(c.literalName(ts, i+1)):
		return i + 4, true
	}
	return 0, false
}

// probeSetting reports whether the setting named (lower-cased; "" when the
// text does not say) says what the node is and belongs to no transaction.
func probeSetting(name string) bool {
	return nodeSettings[name] && !strings.HasPrefix(name, "transaction_")
}

// probeTypes are the types a probe may cast its answer to: built-ins whose
// names cannot be taken by a type of the database's (keywords) or that
// stand first on every search path (pg_catalog's).
var probeTypes = map[string]bool{
	"text": true, "varchar": true, "int": true, "integer": true, "int4": true, "int8": true, "bigint": true,
	"bool": true, "boolean": true, "numeric": true, "pg_lsn": true, "inet": true, "timestamptz": true,
}

func (c *classifier) text(t stok) string { return c.src[t.start:t.end] }

// asciiLower folds ASCII letters only, as the server folds unquoted names.
func asciiLower(s string) string {
	for i := 0; i < len(s); i++ {
		if s[i] >= 'A' && s[i] <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if b[j] >= 'A' && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}

func stokAt(ts []stok, i int) stok {
	if i < 0 || i >= len(ts) {
		return stok{kind: TokError}
	}
	return ts[i]
}
