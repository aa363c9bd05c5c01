package lease

import (
	"math/rand/v2"
	"regexp"
	"testing"
)

// bootIDSpec is the language ValidBootID accepts, as a regexp: the loop must
// accept exactly these strings.
var bootIDSpec = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

func TestValidBootID(t *testing.T) {
	for _, c := range []struct {
		in   string
		want bool
	}{
		{"0f4c2e9a-5b1d-4c3e-8f7a-1b2c3d4e5f60", true},
		{"00000000-0000-0000-0000-000000000000", true},
		{"0F4C2E9A-5B1D-4C3E-8F7A-1B2C3D4E5F60", false}, // the kernel writes lowercase
		{"0f4c2e9a5b1d4c3e8f7a1b2c3d4e5f60", false},
		{"0f4c2e9a-5b1d-4c3e-8f7a-1b2c3d4e5f60\n", false}, // the file's newline is trimmed before
		{"{0f4c2e9a-5b1d-4c3e-8f7a-1b2c3d4e5f60}", false},
		{"0f4c2e9a-5b1d-4c3e-8f7a-1b2c3d4e5f6g", false},
		{"0f4c2e9a-5b1d-4c3e-8f7a_1b2c3d4e5f60", false},
		{"0f4c2e9a-5b1d-4c3e-8f7a-1b2c3d4e5f6", false},
		{"", false},
	} {
		if got := ValidBootID(c.in); got != c.want {
			t.Errorf("ValidBootID(%q) = %v, want %v", c.in, got, c.want)
		}
		if spec := bootIDSpec.MatchString(c.in); spec != c.want {
			t.Errorf("the spec regexp says %v for %q: the table is wrong", spec, c.in)
		}
	}
}

// Random near-UUIDs (one byte changed, from an alphabet around the edges of
// the valid one) agree with the regexp.
func TestValidBootIDAgreesWithTheRegexp(t *testing.T) {
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 0))
	const alphabet = "0189afgAF-_ /\x00\xff"
	base := []byte("0f4c2e9a-5b1d-4c3e-8f7a-1b2c3d4e5f60")
	for i := 0; i < 20000; i++ {
		b := append([]byte(nil), base...)
		for k := r.IntN(3); k >= 0; k-- {
			b[r.IntN(len(b))] = alphabet[r.IntN(len(alphabet))]
		}
		if r.IntN(10) == 0 {
			b = b[:r.IntN(len(b)+1)]
		}
		s := string(b)
		if ValidBootID(s) != bootIDSpec.MatchString(s) {
			t.Fatalf("ValidBootID(%q) = %v, the regexp says %v (replay: seed %d)", s, ValidBootID(s), !ValidBootID(s), seed)
		}
	}
}

// FuzzValidBootID: any input, the loop and the regexp agree.
func FuzzValidBootID(f *testing.F) {
	f.Add("0f4c2e9a-5b1d-4c3e-8f7a-1b2c3d4e5f60")
	f.Add("0f4c2e9a-5b1d-4c3e-8f7a-1b2c3d4e5f6")
	f.Fuzz(func(t *testing.T, s string) {
		if ValidBootID(s) != bootIDSpec.MatchString(s) {
			t.Fatalf("ValidBootID(%q) = %v, the regexp disagrees", s, ValidBootID(s))
		}
	})
}
