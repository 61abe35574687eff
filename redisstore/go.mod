module github.com/pgryw/pgryw/redisstore

go 1.25.0

replace github.com/pgryw/pgryw => ../

require (
	github.com/pgryw/pgryw v0.0.0-00010101000000-000000000000
	github.com/redis/go-redis/v9 v9.22.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
)
