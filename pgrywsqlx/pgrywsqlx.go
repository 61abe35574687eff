// Package pgrywsqlx makes github.com/jmoiron/sqlx work with pgryw as its
// users write code: sqlx picks the placeholder style by driver name, and it
// does not know "pgryw" (so it would bind ? and named queries would fail
// with a syntax error). Importing this package binds "pgryw" to sqlx's $n
// style, once, for the whole program:
//
//	import (
//		"github.com/jmoiron/sqlx"
//		_ "github.com/pgryw/pgryw/pgrywsqlx"
//	)
//
//	db, err := sqlx.Open("pgryw", dsn)
//
// It is a module of its own, so that pgryw's users who do not use sqlx never
// download it.
package pgrywsqlx

import (
	"github.com/jmoiron/sqlx"

	_ "github.com/pgryw/pgryw" // registers the "pgryw" driver
)

// DriverName is pgryw's database/sql driver name, bound to sqlx.DOLLAR.
const DriverName = "pgryw"

func init() { sqlx.BindDriver(DriverName, sqlx.DOLLAR) }

// Open is sqlx.Open("pgryw", dsn).
func Open(dsn string) (*sqlx.DB, error) { return sqlx.Open(DriverName, dsn) }

// Connect is sqlx.Connect("pgryw", dsn): Open, then a Ping.
func Connect(dsn string) (*sqlx.DB, error) { return sqlx.Connect(DriverName, dsn) }
