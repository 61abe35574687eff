// Package ormcheck runs sqlx and GORM on top of pgryw against a real primary
// and real streaming replicas. It is its own module so that pgryw's users
// never download either library.
package ormcheck
