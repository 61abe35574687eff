package sqlcstyle

import (
	"context"

	"github.com/jackc/pgx/v5/pgtype"
)

const countAuthors = `-- name: CountAuthors :one
SELECT count(*) FROM sqlc_authors
`

// CountAuthors counts the authors.
func (q *Queries) CountAuthors(ctx context.Context) (int64, error) {
	row := q.db.QueryRow(ctx, countAuthors)
	var count int64
	err := row.Scan(&count)
	return count, err
}

const createAuthor = `-- name: CreateAuthor :one
INSERT INTO sqlc_authors (
  id, name, bio
) VALUES (
  $1, $2, $3
)
RETURNING id, name, bio
`

// CreateAuthorParams are CreateAuthor's parameters.
type CreateAuthorParams struct {
	ID   int64
	Name string
	Bio  pgtype.Text
}

// CreateAuthor inserts an author and returns it.
func (q *Queries) CreateAuthor(ctx context.Context, arg CreateAuthorParams) (Author, error) {
	row := q.db.QueryRow(ctx, createAuthor, arg.ID, arg.Name, arg.Bio)
	var i Author
	err := row.Scan(&i.ID, &i.Name, &i.Bio)
	return i, err
}

// CreateAuthorsParams are one row of CreateAuthors.
type CreateAuthorsParams struct {
	ID   int64
	Name string
	Bio  pgtype.Text
}

const deleteAuthor = `-- name: DeleteAuthor :execrows
DELETE FROM sqlc_authors
WHERE id = $1
`

// DeleteAuthor deletes an author and says how many rows went.
func (q *Queries) DeleteAuthor(ctx context.Context, id int64) (int64, error) {
	result, err := q.db.Exec(ctx, deleteAuthor, id)
	if err != nil {
		return 0, err
	}
	return result.RowsAffected(), nil
}

const getAuthor = `-- name: GetAuthor :one
SELECT id, name, bio FROM sqlc_authors
WHERE id = $1 LIMIT 1
`

// GetAuthor reads one author.
func (q *Queries) GetAuthor(ctx context.Context, id int64) (Author, error) {
	row := q.db.QueryRow(ctx, getAuthor, id)
	var i Author
	err := row.Scan(&i.ID, &i.Name, &i.Bio)
	return i, err
}

const listAuthors = `-- name: ListAuthors :many
SELECT id, name, bio FROM sqlc_authors
WHERE id >= $1
ORDER BY id
`

// ListAuthors reads the authors from an id on.
func (q *Queries) ListAuthors(ctx context.Context, id int64) ([]Author, error) {
	rows, err := q.db.Query(ctx, listAuthors, id)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var items []Author
	for rows.Next() {
		var i Author
		if err := rows.Scan(&i.ID, &i.Name, &i.Bio); err != nil {
			return nil, err
		}
		items = append(items, i)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return items, nil
}

const updateAuthorBio = `-- name: UpdateAuthorBio :exec
UPDATE sqlc_authors
  set bio = $2
WHERE id = $1
`

// UpdateAuthorBioParams are UpdateAuthorBio's parameters.
type UpdateAuthorBioParams struct {
	ID  int64
	Bio pgtype.Text
}

// UpdateAuthorBio changes an author's bio.
func (q *Queries) UpdateAuthorBio(ctx context.Context, arg UpdateAuthorBioParams) error {
	_, err := q.db.Exec(ctx, updateAuthorBio, arg.ID, arg.Bio)
	return err
}
