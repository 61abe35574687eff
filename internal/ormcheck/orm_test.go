package ormcheck

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jmoiron/sqlx"
	"github.com/pgryw/pgryw"
	"github.com/pgryw/pgryw/internal/pgtest"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

var cluster *pgtest.Cluster

func TestMain(m *testing.M) {
	os.Exit(pgtest.Main(m, pgtest.Options{Replicas: 2}, func(c *pgtest.Cluster) { cluster = c }))
}

// open returns a pgryw pool on the cluster, its replicas 100ms behind, and
// the connector for its Stats.
func open(t *testing.T) (*sql.DB, *pgryw.Connector) {
	t.Helper()
	pgtest.Require(t, cluster)
	ctx := context.Background()
	if err := cluster.SetApplyDelay(ctx, -1, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cluster.SetApplyDelay(ctx, -1, 0)
		cluster.WaitCaughtUp(ctx)
	})
	cfg, err := pgryw.ParseDSN(cluster.WriterDSN() + "&wait_timeout=2s&replicas=" + strings.Join(cluster.ReplicaAddrs(), ","))
	if err != nil {
		t.Fatal(err)
	}
	c, err := pgryw.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	t.Cleanup(func() { db.Close() })
	return db, c
}

type user struct {
	ID    int64  `db:"id" gorm:"primaryKey"`
	Name  string `db:"name"`
	Email string `db:"email" gorm:"uniqueIndex"`
}

func TestSqlx(t *testing.T) {
	sdb, c := open(t)
	db := sqlx.NewDb(sdb, "pgx") // "pgx" selects sqlx's $n bind style
	db.MustExec("CREATE TABLE sqlx_users (id bigserial PRIMARY KEY, name text NOT NULL, email text UNIQUE)")
	if err := cluster.WaitCaughtUp(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		res, err := db.NamedExec("INSERT INTO sqlx_users (name, email) VALUES (:name, :email)",
			user{Name: "ada", Email: "ada" + string(rune('a'+i)) + "@example.com"})
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			t.Fatalf("RowsAffected %d", n)
		}
		var got []user
		if err := db.Select(&got, db.Rebind("SELECT id, name, email FROM sqlx_users WHERE name = ? ORDER BY id"), "ada"); err != nil {
			t.Fatal(err)
		}
		if len(got) != i+1 {
			t.Fatalf("after %d inserts sqlx saw %d rows: stale read", i+1, len(got))
		}
	}
	var u user
	if err := db.Get(&u, "SELECT id, name, email FROM sqlx_users WHERE email = $1", "nobody"); !errors.Is(err, sql.ErrNoRows) {
		t.Fatalf("Get of a missing row: %v", err)
	}
	tx := db.MustBegin()
	tx.MustExec("UPDATE sqlx_users SET name = $1 WHERE email = $2", "grace", "adaa@example.com")
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := db.Get(&u, "SELECT id, name, email FROM sqlx_users WHERE email = $1", "adaa@example.com"); err != nil || u.Name != "grace" {
		t.Fatalf("after commit: %+v %v", u, err)
	}
	if s := c.Stats(); s.ReplicaReads < 20 {
		t.Fatalf("reads were not served by replicas: %+v", s)
	}
}

func TestGORM(t *testing.T) {
	sdb, c := open(t)
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: sdb}), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	type GormUser struct {
		ID    int64
		Name  string
		Email string `gorm:"uniqueIndex"`
	}
	if err := db.AutoMigrate(&GormUser{}); err != nil {
		t.Fatal(err)
	}
	if err := cluster.WaitCaughtUp(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		u := GormUser{Name: "ada", Email: "ada" + string(rune('a'+i)) + "@example.com"}
		if err := db.Create(&u).Error; err != nil { // INSERT … RETURNING "id"
			t.Fatal(err)
		}
		var got GormUser
		if err := db.First(&got, u.ID).Error; err != nil {
			t.Fatalf("First(%d) right after Create: %v (stale read)", u.ID, err)
		}
	}
	var missing GormUser
	if err := db.First(&missing, 999999).Error; !errors.Is(err, gorm.ErrRecordNotFound) {
		t.Fatalf("First of a missing row: %v", err)
	}
	// GORM type-asserts the driver's error to *pgconn.PgError to translate it.
	dup := GormUser{Name: "dup", Email: "adaa@example.com"}
	err = db.Create(&dup).Error
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
		t.Fatalf("duplicate key: %v", err)
	}
	// Nested transactions use savepoints; all of it runs on the primary.
	err = db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Model(&GormUser{}).Where("email = ?", "adab@example.com").Update("name", "grace").Error; err != nil {
			return err
		}
		return tx.Transaction(func(tx2 *gorm.DB) error {
			return tx2.Create(&GormUser{Name: "inner", Email: "inner@example.com"}).Error
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	if err := db.Model(&GormUser{}).Where("name IN ?", []string{"grace", "inner"}).Count(&n).Error; err != nil || n != 2 {
		t.Fatalf("after the transaction: count=%d err=%v", n, err)
	}
	if s := c.Stats(); s.ReplicaReads < 20 {
		t.Fatalf("reads were not served by replicas: %+v", s)
	}
}

// Two handles to one database, as GORM's users hold them (GORM's own
// TestPreparedStmtConcurrentClose opens a second *sql.DB on the same DSN):
// one gorm.DB with PrepareStmt beside another, each on its own
// sql.Open("pgryw", dsn) pool. A write through one is seen by a read
// through the other at once, with the replicas 100 ms behind.
func TestGORMTwoHandles(t *testing.T) {
	open(t) // the replicas' delay
	dsn := cluster.WriterDSN() + "&wait_timeout=2s&replicas=" + strings.Join(cluster.ReplicaAddrs(), ",")
	handle := func(prepare bool) *gorm.DB {
		db, err := gorm.Open(postgres.New(postgres.Config{DriverName: "pgryw", DSN: dsn}), &gorm.Config{Logger: logger.Discard, PrepareStmt: prepare})
		if err != nil {
			t.Fatal(err)
		}
		sdb, err := db.DB()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sdb.Close() })
		return db
	}
	a, b := handle(true), handle(false)
	type TwoHandle struct {
		ID   int64
		Name string
	}
	if err := a.AutoMigrate(&TwoHandle{}); err != nil {
		t.Fatal(err)
	}
	if err := cluster.WaitCaughtUp(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		w, r := a, b
		if i%2 == 1 {
			w, r = b, a
		}
		u := TwoHandle{Name: "h"}
		if err := w.Create(&u).Error; err != nil {
			t.Fatal(err)
		}
		var got TwoHandle
		if err := r.First(&got, u.ID).Error; err != nil {
			t.Fatalf("First(%d) through the other handle right after Create: %v (stale read)", u.ID, err)
		}
	}
	sdb, _ := b.DB()
	st, err := pgryw.StatsOf(sdb)
	if err != nil {
		t.Fatal(err)
	}
	if st.ReplicaReads == 0 {
		t.Fatalf("no read of the second handle was served by a replica: %+v", st)
	}
}
