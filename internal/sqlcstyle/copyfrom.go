package sqlcstyle

import (
	"context"
)

// iteratorForCreateAuthors implements pgx.CopyFromSource.
type iteratorForCreateAuthors struct {
	rows                 []CreateAuthorsParams
	skippedFirstNextCall bool
}

func (r *iteratorForCreateAuthors) Next() bool {
	if len(r.rows) == 0 {
		return false
	}
	if !r.skippedFirstNextCall {
		r.skippedFirstNextCall = true
		return true
	}
	r.rows = r.rows[1:]
	return len(r.rows) > 0
}

func (r iteratorForCreateAuthors) Values() ([]interface{}, error) {
	return []interface{}{
		r.rows[0].ID,
		r.rows[0].Name,
		r.rows[0].Bio,
	}, nil
}

func (r iteratorForCreateAuthors) Err() error {
	return nil
}

// CreateAuthors copies authors in (:copyfrom).
func (q *Queries) CreateAuthors(ctx context.Context, arg []CreateAuthorsParams) (int64, error) {
	return q.db.CopyFrom(ctx, []string{"sqlc_authors"}, []string{"id", "name", "bio"}, &iteratorForCreateAuthors{rows: arg})
}
