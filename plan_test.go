package pgryw

import "testing"

// The plan's whole table for statements: every combination of its inputs,
// the target and the route ServedBy reports when served as planned.
func TestPlanStmt(t *testing.T) {
	for i := 0; i < 1<<8; i++ {
		in := planInput{read: i&1 != 0, hintReplica: i&2 != 0, hintPrimary: i&4 != 0, pinned: i&8 != 0,
			inBlock: i&16 != 0, node: i&32 != 0, pin: i&64 != 0, txControl: i&128 != 0}
		if in.read && (in.pin || in.txControl) {
			continue // readOnly is false for both
		}
		want := plan{read: in.read}
		switch {
		case in.hintReplica && !in.read:
			want.target = targetRefused // a write cannot obey a replica hint
		case !in.read, in.hintPrimary, in.inBlock, !in.hintReplica && (in.pinned || in.node):
			// a write, a primary hint, an Exec'd block, or session state or
			// a node-local answer without a replica hint: the primary
			want.target = targetPrimary
			switch {
			case in.inBlock || in.txControl:
				want.route = RouteTransaction
			case in.pin:
				want.route = RoutePinned
			case !in.read:
				want.route = RouteWrite
			case in.hintPrimary:
				want.route = RoutePrimaryHint
			case in.pinned:
				want.route = RoutePinned
			default:
				want.route = RouteNodeLocal
			}
		case in.hintReplica:
			want.target, want.route = targetReplica, RouteReplicaHint
		default:
			want.target, want.route = targetReplica, RouteReplica
		}
		if got := planStmt(in); got != want {
			t.Errorf("%+v: %+v, want %+v", in, got, want)
		}
	}
	// The cases the routing table names (docs/routing.md).
	for _, c := range []struct {
		name string
		in   planInput
		want target
	}{
		{"a read", planInput{read: true}, targetReplica},
		{"a write", planInput{}, targetPrimary},
		{"a write with /* pgryw:replica */", planInput{hintReplica: true}, targetRefused},
		{"a read with /* pgryw:primary */", planInput{read: true, hintPrimary: true}, targetPrimary},
		{"a read on a pinned connection", planInput{read: true, pinned: true}, targetPrimary},
		{"a read with /* pgryw:replica */ on a pinned connection", planInput{read: true, pinned: true, hintReplica: true}, targetReplica},
		{"a read inside an Exec'd BEGIN", planInput{read: true, inBlock: true}, targetPrimary},
		{"both hints: primary wins", planInput{read: true, hintPrimary: true, hintReplica: true}, targetPrimary},
		{"a node-local read", planInput{read: true, node: true}, targetPrimary},
		{"a node-local read with /* pgryw:replica */", planInput{read: true, node: true, hintReplica: true}, targetReplica},
	} {
		if got := planStmt(c.in).target; got != c.want {
			t.Errorf("%s: target %v, want %v", c.name, got, c.want)
		}
	}
}

// The plan's whole table for a database/sql BEGIN.
func TestPlanBegin(t *testing.T) {
	for i := 0; i < 1<<6; i++ {
		in := planInput{begin: true, readOnlyTx: i&1 != 0, serializable: i&2 != 0, hintReplica: i&4 != 0,
			hintPrimary: i&8 != 0, pinned: i&16 != 0, inBlock: i&32 != 0}
		want := plan{read: in.readOnlyTx}
		switch {
		case in.readOnlyTx && !in.serializable && !in.pinned && !in.hintPrimary && !in.inBlock:
			want.target, want.route = targetReplica, RouteReplica
			if in.hintReplica {
				want.route = RouteReplicaHint
			}
		case in.readOnlyTx && in.hintPrimary:
			want.route = RoutePrimaryHint
		case in.readOnlyTx && in.pinned:
			want.route = RoutePinned
		default: // read-write, serializable, or inside an Exec'd block
			want.route = RouteTransaction
		}
		if got := planStmt(in); got != want {
			t.Errorf("%+v: %+v, want %+v", in, got, want)
		}
	}
}

// A fallback is reported as one, and a replica's 25006 as a write.
func TestPlanFellBack(t *testing.T) {
	p := planStmt(planInput{read: true})
	p.fellBack(false)
	if p.target != targetPrimary || p.route != RouteFallback || !p.tried || !p.read {
		t.Errorf("fallback: %+v", p)
	}
	p = planStmt(planInput{read: true, hintReplica: true})
	p.fellBack(true)
	if p.target != targetPrimary || p.route != RouteWrite || !p.tried || p.read {
		t.Errorf("25006: %+v", p)
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
