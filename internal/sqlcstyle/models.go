package sqlcstyle

import (
	"github.com/jackc/pgx/v5/pgtype"
)

// Author is a row of sqlc_authors.
type Author struct {
	ID   int64
	Name string
	Bio  pgtype.Text
}
