package resolve

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bootc-fleet/bootc-fleet/tests/testregistry"
)

func TestTransportWithCAFile(t *testing.T) {
	reg := testregistry.Start(t)
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("ca.pem", string(reg.CAPEM))
	tr, err := TransportWithCAFile(good)
	if err != nil {
		t.Fatal(err)
	}
	if tr.TLSClientConfig == nil || tr.TLSClientConfig.RootCAs == nil {
		t.Fatal("no root CAs set")
	}
	for file, want := range map[string]string{
		filepath.Join(dir, "absent.pem"): "no such file",
		write("empty.pem", ""):           "no PEM certificate",
		write("key.pem", "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"): `is a "PRIVATE KEY", want CERTIFICATE`,
		write("junk.pem", string(reg.CAPEM)+"trailing junk"):                               "not PEM after certificate 1",
		write("bad.pem", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"): "certificate 1:",
	} {
		if _, err := TransportWithCAFile(file); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", filepath.Base(file), err, want)
		}
	}
}
