package sqlclass

import "strings"

// funcEffect is what calling a known built-in does to routing.
type funcEffect uint8

const (
	effWrite funcEffect = iota + 1 // fails on a standby, or changes the writer's state
	effPin                         // changes session state later statements rely on
)

// knownFuncs lists functions whose effect is known without the catalog. It is
// consulted before builtinReadFuncs because some of these are stable in
// pg_proc yet write: pg_current_xact_id() and txid_current() assign a
// transaction id, which a standby cannot do. A name matches here whatever
// schema it was qualified with: a user's public.nextval is then sent to the
// writer, which costs a replica read but can never fail on a standby.
var knownFuncs = map[string]funcEffect{
	// Sequences and transaction ids.
	"nextval":            effWrite,
	"setval":             effWrite,
	"pg_current_xact_id": effWrite,
	"txid_current":       effWrite,
	// Values that only mean something in the session that made them.
	"currval":    effPin,
	"lastval":    effPin,
	"set_config": effPin,
	"setseed":    effPin,
	// Large objects (the lo_ prefix is matched separately).
	"lowrite": effWrite,
	"loread":  effWrite, // needs a descriptor from lo_open in the same session
	// Asynchronous notification and remote execution.
	"pg_notify":   effWrite,
	"dblink_exec": effWrite,
	// Server administration: none of it belongs on a replica by accident.
	"pg_promote":                          effWrite,
	"pg_terminate_backend":                effWrite,
	"pg_cancel_backend":                   effWrite,
	"pg_reload_conf":                      effWrite,
	"pg_rotate_logfile":                   effWrite,
	"pg_rotate_logfile_old":               effWrite,
	"pg_switch_wal":                       effWrite,
	"pg_create_restore_point":             effWrite,
	"pg_backup_start":                     effWrite,
	"pg_backup_stop":                      effWrite,
	"pg_start_backup":                     effWrite,
	"pg_stop_backup":                      effWrite,
	"pg_wal_replay_pause":                 effWrite,
	"pg_wal_replay_resume":                effWrite,
	"pg_log_backend_memory_contexts":      effWrite,
	"pg_log_standby_snapshot":             effWrite,
	"pg_import_system_collations":         effWrite,
	"pg_nextoid":                          effWrite,
	"pg_stop_making_pinned_objects":       effWrite,
	"pg_create_physical_replication_slot": effWrite,
	"pg_create_logical_replication_slot":  effWrite,
	"pg_drop_replication_slot":            effWrite,
	"pg_copy_physical_replication_slot":   effWrite,
	"pg_copy_logical_replication_slot":    effWrite,
	"pg_replication_slot_advance":         effWrite,
	"pg_sync_replication_slots":           effWrite,
	"pg_logical_emit_message":             effWrite,
	"brin_summarize_new_values":           effWrite,
	"brin_summarize_range":                effWrite,
	"brin_desummarize_range":              effWrite,
	"gin_clean_pending_list":              effWrite,
	"pg_extension_config_dump":            effWrite,
	"pg_restore_relation_stats":           effWrite,
	"pg_restore_attribute_stats":          effWrite,
	"pg_clear_relation_stats":             effWrite,
	"pg_clear_attribute_stats":            effWrite,
	"pg_stat_statements_reset":            effWrite,
	"pg_file_write":                       effWrite,
	"pg_file_rename":                      effWrite,
	"pg_file_unlink":                      effWrite,
	"pg_file_sync":                        effWrite,
}

// knownPrefixes covers function families by name prefix.
var knownPrefixes = [...]struct {
	prefix string
	eff    funcEffect
}{
	{"pg_advisory_", effPin}, // session locks would be taken on the wrong node
	{"pg_try_advisory_", effPin},
	{"lo_", effWrite}, // large objects: lo_create, lo_import, lo_put, lo_unlink...
	{"pg_stat_reset", effWrite},
	{"pg_replication_origin_", effWrite},
	{"pg_logical_slot_", effWrite},
	{"binary_upgrade_", effWrite},
}

// volatileReads are volatile pg_catalog functions that have no side effect
// and give an equally good answer on a standby, so the catalog rule (every
// overload immutable or stable) would wrongly keep them off replicas.
var volatileReads = map[string]struct{}{
	"random":                        {},
	"random_normal":                 {},
	"clock_timestamp":               {},
	"timeofday":                     {},
	"gen_random_uuid":               {},
	"uuidv4":                        {},
	"uuidv7":                        {},
	"pg_sleep":                      {},
	"pg_sleep_for":                  {},
	"pg_sleep_until":                {},
	"pg_is_in_recovery":             {},
	"pg_last_wal_replay_lsn":        {},
	"pg_last_wal_receive_lsn":       {},
	"pg_last_xact_replay_timestamp": {},
	"pg_is_wal_replay_paused":       {},
	"pg_get_wal_replay_pause_state": {},
	"pg_jit_available":              {},
	"pg_relation_size":              {},
	"pg_table_size":                 {},
	"pg_indexes_size":               {},
	"pg_total_relation_size":        {},
	"pg_database_size":              {},
	"pg_tablespace_size":            {},
}

// knownEffect reports the effect of calling a function whose unqualified
// name is name, if it is known to write or pin.
func knownEffect(name string) funcEffect {
	if e, ok := knownFuncs[name]; ok {
		return e
	}
	for _, p := range knownPrefixes {
		if strings.HasPrefix(name, p.prefix) {
			return p.eff
		}
	}
	return 0
}

// IsBuiltinRead reports whether name — as it appears in Result.Funcs, or a
// bare or pg_catalog-qualified name — is a built-in function that is
// read-only on every overload (from the PostgreSQL 15 catalog), or one of the
// volatile built-ins known to be harmless on a standby. Names with any other
// schema are never built-in.
func IsBuiltinRead(name string) bool {
	if rest, ok := strings.CutPrefix(name, "pg_catalog."); ok {
		name = rest
	}
	if strings.IndexByte(name, '.') >= 0 || knownEffect(name) != 0 {
		return false
	}
	if _, ok := builtinReadFuncs[name]; ok {
		return true
	}
	_, ok := volatileReads[name]
	return ok
}
