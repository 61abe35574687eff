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

// Node identity and node-local state: reads whose answer depends on the
// node that gives it, so that a replica's answer differs from the writer's
// (it is in recovery, read-only, has its own backends, locks, statistics,
// WAL position and files; a sequence's own columns show on a standby the
// value the writer pre-logged, up to 32 ahead). Such a read is answered by
// the writer, as it would be on a connection to the writer alone.

// nodeFuncs are built-in functions of node identity and node-local state
// (nodeFuncPrefixes covers families).
var nodeFuncs = map[string]bool{
	"pg_is_in_recovery": true, "pg_backend_pid": true, "inet_server_addr": true, "inet_server_port": true,
	"pg_current_wal_lsn": true, "pg_current_wal_insert_lsn": true, "pg_current_wal_flush_lsn": true,
	"pg_walfile_name": true, "pg_walfile_name_offset": true,
	"pg_last_wal_replay_lsn": true, "pg_last_wal_receive_lsn": true, "pg_last_xact_replay_timestamp": true,
	"pg_is_wal_replay_paused": true, "pg_get_wal_replay_pause_state": true,
	"pg_current_snapshot": true, "txid_current_snapshot": true,
	"pg_current_xact_id_if_assigned": true, "txid_current_if_assigned": true,
	"pg_postmaster_start_time": true, "pg_conf_load_time": true, "pg_current_logfile": true,
	"pg_control_checkpoint": true, "pg_control_recovery": true,
	"pg_lock_status": true, "pg_blocking_pids": true, "pg_safe_snapshot_blocking_pids": true,
	"pg_get_replication_slots": true, "pg_prepared_xact": true, "pg_show_all_settings": true,
	"pg_show_all_file_settings": true, "pg_hba_file_rules": true, "pg_ident_file_mappings": true,
	"pg_get_backend_memory_contexts": true, "pg_get_shmem_allocations": true,
	"pg_sequence_last_value": true, "pg_last_committed_xact": true, "pg_listening_channels": true,
	"pg_notification_queue_usage": true, "pg_backup_start_time": true, "pg_is_in_backup": true,
	"pg_tablespace_location": true,
}

var nodeFuncPrefixes = [...]string{"pg_stat_get_", "pg_ls_", "pg_read_", "pg_stat_file", "pg_wal_summary"}

// nodeFunc reports whether the built-in function name (unqualified) reads
// node identity or node-local state.
func nodeFunc(name string) bool {
	if nodeFuncs[name] {
		return true
	}
	for _, p := range nodeFuncPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// nodeRelations are system views of node-local state (nodeRelationPrefixes
// covers the statistics views), and the columns only a sequence has.
var nodeRelations = map[string]bool{
	"pg_locks": true, "pg_replication_slots": true, "pg_prepared_xacts": true, "pg_settings": true,
	"pg_file_settings": true, "pg_hba_file_rules": true, "pg_ident_file_mappings": true,
	"pg_backend_memory_contexts": true, "pg_shmem_allocations": true, "pg_replication_origin_status": true,
	"pg_sequences": true, "pg_prepared_statements": true, "pg_cursors": true, "pg_wait_events": true,
	"pg_aios": true, "pg_shmem_allocations_numa": true,
	// A sequence's own columns.
	"last_value": true, "log_cnt": true, "is_called": true,
}

var nodeRelationPrefixes = [...]string{"pg_stat_", "pg_statio_"}

// isNodeRelation reports whether an unquoted name is one of nodeRelations
// (matched as the server folds it, ASCII only).
func isNodeRelation(n string) bool {
	if len(n) < 6 || len(n) > 40 {
		return false
	}
	var b [40]byte
	for i := 0; i < len(n); i++ {
		c := n[i]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		b[i] = c
	}
	name := string(b[:len(n)])
	if nodeRelations[name] {
		return true
	}
	for _, p := range nodeRelationPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// nodeSettings are run-time parameters whose value depends on the node: a
// standby is read-only and in hot standby, and it has its own configuration
// of where it listens, what it follows and how it replays.
var nodeSettings = map[string]bool{
	"transaction_read_only": true, "in_hot_standby": true, "port": true, "listen_addresses": true,
	"data_directory": true, "config_file": true, "hba_file": true, "ident_file": true,
	"primary_conninfo": true, "primary_slot_name": true, "recovery_min_apply_delay": true,
	"hot_standby": true, "hot_standby_feedback": true, "max_standby_streaming_delay": true,
	"max_standby_archive_delay": true, "cluster_name": true, "recovery_target_timeline": true,
	"promote_trigger_file": true, "restore_command": true, "archive_mode": true, "archive_command": true,
	"synchronous_standby_names": true, "wal_receiver_status_interval": true,
}
