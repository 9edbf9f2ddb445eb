package resolve

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestPinRoundTrip(t *testing.T) {
	for _, raw := range []string{"203.0.113.7", "127.0.0.2", "2001:db8::1", "::ffff:10.0.0.1"} {
		a := netip.MustParseAddr(raw)
		got, err := Unpin(Pin(a))
		if err != nil || got != a.Unmap() {
			t.Errorf("%s -> %s -> %v %v", raw, Pin(a), got, err)
		}
	}
	for _, name := range []string{"pypi.org", "ip4-1-2-3.pinned.corral.invalid", "ip4-1-2-3-4.pinned.corral.invalid.evil", "ip6-zz.pinned.corral.invalid"} {
		if _, err := Unpin(name); err == nil {
			t.Errorf("Unpin(%q) accepted", name)
		}
	}
	if _, err := (Pinned{}).LookupIP(context.Background(), "ip", "pypi.org"); err == nil {
		t.Error("the engine's resolver must answer pinned names only")
	}
}

func TestHostsFileBeforeDNSAndReread(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hosts")
	os.WriteFile(path, []byte("# comment\n127.0.0.2 web.test Alias.Test.\n::1 six.test\n127.0.0.3 web.test\n"), 0o600)
	r := &Resolver{HostsFile: path}
	got, err := r.Resolve(context.Background(), "web.test")
	if err != nil || len(got) != 2 || got[0].String() != "127.0.0.2" || got[1].String() != "127.0.0.3" {
		t.Fatalf("%v %v", got, err)
	}
	if got, _ := r.Resolve(context.Background(), "alias.test"); len(got) != 1 {
		t.Fatalf("alias: %v", got)
	}
	time.Sleep(150 * time.Millisecond)
	os.WriteFile(path, []byte("127.0.0.9 web.test\n"), 0o600)
	future := time.Now().Add(time.Second)
	os.Chtimes(path, future, future)
	got, _ = r.Resolve(context.Background(), "web.test")
	if len(got) != 1 || got[0].String() != "127.0.0.9" {
		t.Fatalf("not re-read: %v", got)
	}
}
