package pgryw

import "testing"

// The routing decision's whole table: every combination of its inputs.
func TestDecide(t *testing.T) {
	for i := 0; i < 1<<6; i++ {
		in := routeInput{read: i&1 != 0, hintReplica: i&2 != 0, hintPrimary: i&4 != 0, pinned: i&8 != 0, inBlock: i&16 != 0, node: i&32 != 0}
		var wantReplica, wantRefused bool
		switch {
		case in.hintReplica && !in.read:
			wantRefused = true // a write cannot obey a replica hint
		case !in.read, in.hintPrimary, in.inBlock:
			// a write, a primary hint, or an Exec'd block: the primary
		case in.pinned, in.node:
			wantReplica = in.hintReplica // session state, or a node-local answer: only a replica hint leaves
		default:
			wantReplica = true
		}
		toReplica, refused := decide(in)
		if toReplica != wantReplica || refused != wantRefused {
			t.Errorf("%+v: replica=%v refused=%v, want %v %v", in, toReplica, refused, wantReplica, wantRefused)
		}
	}
	// The cases the README's routing table names.
	for _, c := range []struct {
		name string
		in   routeInput
		want bool
	}{
		{"a read", routeInput{read: true}, true},
		{"a write", routeInput{}, false},
		{"a read with /* pgryw:primary */", routeInput{read: true, hintPrimary: true}, false},
		{"a read on a pinned connection", routeInput{read: true, pinned: true}, false},
		{"a read with /* pgryw:replica */ on a pinned connection", routeInput{read: true, pinned: true, hintReplica: true}, true},
		{"a read inside an Exec'd BEGIN", routeInput{read: true, inBlock: true}, false},
		{"both hints: primary wins", routeInput{read: true, hintPrimary: true, hintReplica: true}, false},
		{"a node-local read", routeInput{read: true, node: true}, false},
		{"a node-local read with /* pgryw:replica */", routeInput{read: true, node: true, hintReplica: true}, true},
	} {
		if got, _ := decide(c.in); got != c.want {
			t.Errorf("%s: replica=%v, want %v", c.name, got, c.want)
		}
	}
}

// write_functions and read_functions match however a call names the
// function: a write override in any schema, qualified or not; a read
// override with a schema only where the call names it.
func TestFuncOverrides(t *testing.T) {
	c := &Connector{overrides: newFuncOverrides([]string{"lock_it", "s.Audit"}, []string{"f", "public.g", "lock_it"})}
	for _, tc := range []struct {
		call        string
		write, read bool
	}{
		{"lock_it", true, false}, {"public.lock_it", true, false}, {"other.lock_it", true, false},
		{"Audit", true, false}, {"s.Audit", true, false}, {"audit", false, false},
		{"f", false, true}, {"x.f", false, true},
		{"public.g", false, true}, {"g", false, false}, {"x.g", false, false},
	} {
		if w, r := c.forcedWrite(tc.call), c.forcedRead(tc.call); w != tc.write || r != tc.read {
			t.Errorf("%s: write %v read %v, want %v %v", tc.call, w, r, tc.write, tc.read)
		}
	}
}
