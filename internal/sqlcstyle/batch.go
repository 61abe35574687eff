package sqlcstyle

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// ErrBatchAlreadyClosed is reported for a batch's results read after Close.
var (
	ErrBatchAlreadyClosed = errors.New("batch already closed")
)

const getAuthorsBatch = `-- name: GetAuthorsBatch :batchone
SELECT id, name, bio FROM sqlc_authors
WHERE id = $1
`

// GetAuthorsBatchBatchResults are GetAuthorsBatch's results.
type GetAuthorsBatchBatchResults struct {
	br     pgx.BatchResults
	tot    int
	closed bool
}

// GetAuthorsBatch reads several authors in one batch.
func (q *Queries) GetAuthorsBatch(ctx context.Context, id []int64) *GetAuthorsBatchBatchResults {
	batch := &pgx.Batch{}
	for _, a := range id {
		vals := []interface{}{
			a,
		}
		batch.Queue(getAuthorsBatch, vals...)
	}
	br := q.db.SendBatch(ctx, batch)
	return &GetAuthorsBatchBatchResults{br, len(id), false}
}

// QueryRow calls f with each author read.
func (b *GetAuthorsBatchBatchResults) QueryRow(f func(int, Author, error)) {
	defer b.br.Close()
	for t := 0; t < b.tot; t++ {
		var i Author
		if b.closed {
			if f != nil {
				f(t, i, ErrBatchAlreadyClosed)
			}
			continue
		}
		row := b.br.QueryRow()
		err := row.Scan(&i.ID, &i.Name, &i.Bio)
		if f != nil {
			f(t, i, err)
		}
	}
}

// Close closes the results.
func (b *GetAuthorsBatchBatchResults) Close() error {
	b.closed = true
	return b.br.Close()
}

const setAuthorsBioBatch = `-- name: SetAuthorsBioBatch :batchexec
UPDATE sqlc_authors SET bio = $2 WHERE id = $1
`

// SetAuthorsBioBatchBatchResults are SetAuthorsBioBatch's results.
type SetAuthorsBioBatchBatchResults struct {
	br     pgx.BatchResults
	tot    int
	closed bool
}

// SetAuthorsBioBatchParams are one update of SetAuthorsBioBatch.
type SetAuthorsBioBatchParams struct {
	ID  int64
	Bio string
}

// SetAuthorsBioBatch updates several authors in one batch.
func (q *Queries) SetAuthorsBioBatch(ctx context.Context, arg []SetAuthorsBioBatchParams) *SetAuthorsBioBatchBatchResults {
	batch := &pgx.Batch{}
	for _, a := range arg {
		vals := []interface{}{
			a.ID,
			a.Bio,
		}
		batch.Queue(setAuthorsBioBatch, vals...)
	}
	br := q.db.SendBatch(ctx, batch)
	return &SetAuthorsBioBatchBatchResults{br, len(arg), false}
}

// Exec calls f with each update's error.
func (b *SetAuthorsBioBatchBatchResults) Exec(f func(int, error)) {
	defer b.br.Close()
	for t := 0; t < b.tot; t++ {
		if b.closed {
			if f != nil {
				f(t, ErrBatchAlreadyClosed)
			}
			continue
		}
		_, err := b.br.Exec()
		if f != nil {
			f(t, err)
		}
	}
}

// Close closes the results.
func (b *SetAuthorsBioBatchBatchResults) Close() error {
	b.closed = true
	return b.br.Close()
}
