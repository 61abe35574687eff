module github.com/pgryw/pgryw/internal/pgquerycheck

go 1.26.8

replace github.com/pgryw/pgryw => ../..

require (
	github.com/pganalyze/pg_query_go/v6 v6.2.5
	github.com/pgryw/pgryw v0.0.0-00010101000000-000000000000
)

require google.golang.org/protobuf v1.33.0 // indirect
