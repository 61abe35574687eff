package sqlclass

import (
	"bufio"
	"fmt"
	"os"
	"testing"
)

func TestTry(t *testing.T) {
	f := os.Getenv("TRY")
	if f == "" {
		t.Skip()
	}
	fh, _ := os.Open(f)
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		r := Classify(sc.Text())
		fmt.Printf("%-70q W=%v P=%v %v %v F=%v R=%q\n", sc.Text(), r.Write, r.Pin, r.Tx, r.Hint, r.Funcs, r.Reason)
	}
}
