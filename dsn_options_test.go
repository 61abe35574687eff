package pgryw

import "testing"

func TestDropOption(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"-c transaction_read_only=off", ""},
		{"-ctransaction_read_only=off -c work_mem=8MB", "-c work_mem=8MB"},
		{"--transaction-read-only=off -c search_path=a\\ b", "-c search_path=a\\ b"},
		{"-c TRANSACTION_READ_ONLY=on", ""},
		{"-c transaction_read_only_x=1", "-c transaction_read_only_x=1"},
		{"  -c  a=1  ", "-c a=1"},
	} {
		if got := dropOption(c.in, "transaction_read_only"); got != c.want {
			t.Errorf("dropOption(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
