package admin

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"

	"corral.dev/gateway/internal/bindings"
	"corral.dev/gateway/internal/records"
)

func TestAdminEndpoints(t *testing.T) {
	store := bindings.NewStore()
	b, err := bindings.Parse("u1", []byte(`{"v":1,"namespace":"ns","session":"","agent":"checker","credentialSha256":"","agentRules":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	store.Put("f", bindings.Claim{UID: "u1", Addrs: []netip.Addr{netip.MustParseAddr("198.18.0.5")}, Binding: b})
	recs := records.NewStore(nil)
	recs.Hit(records.Who{Known: true, Namespace: "ns", Session: "", Agent: "checker", Identity: "agent"}, "pypi.org", 443, "denied", "not-allowed")
	var ready atomic.Bool
	srv := httptest.NewServer((&Server{Bindings: store, Records: recs, Ready: ready.Load,
		Gauges: func() records.Gauges { return records.Gauges{Bindings: store.Count()} }}).Handler())
	defer srv.Close()
	get := func(path string) (int, string) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var sb strings.Builder
		buf := make([]byte, 4096)
		for {
			n, err := resp.Body.Read(buf)
			sb.Write(buf[:n])
			if err != nil {
				break
			}
		}
		return resp.StatusCode, sb.String()
	}
	if code, _ := get("/readyz"); code != 503 {
		t.Errorf("ready before the first sync: %d", code)
	}
	ready.Store(true)
	if code, _ := get("/readyz"); code != 200 {
		t.Errorf("not ready after the sync: %d", code)
	}
	code, body := get("/v1/egress?namespace=ns&session=")
	var rep records.Report
	if code != 200 || json.Unmarshal([]byte(body), &rep) != nil || rep.Agent != "checker" || len(rep.Hosts) != 1 {
		t.Errorf("the Evidence session's records: %d %s", code, body)
	}
	if code, _ := get("/v1/egress?namespace=ns&session=other"); code != 404 {
		t.Errorf("unknown session: %d", code)
	}
	if code, body := get("/v1/egress"); code != 200 || !strings.Contains(body, `"agent":"checker"`) {
		t.Errorf("summaries: %d %s", code, body)
	}
	code, body = get("/v1/egress?detail=hosts")
	var all struct{ Sessions []records.Report }
	if code != 200 || json.Unmarshal([]byte(body), &all) != nil || len(all.Sessions) != 1 || len(all.Sessions[0].Hosts) != 1 {
		t.Errorf("every session's records: %d %s", code, body)
	}
	if code, body := get("/v1/bindings?ip=198.18.0.5"); code != 200 || !strings.Contains(body, `"custodian":false`) {
		t.Errorf("binding: %d %s", code, body)
	}
	// The digest is the annotation text's SHA-256: what the operator compares before it lets a
	// re-bound (adopted) pod act.
	if _, body := get("/v1/bindings?ip=198.18.0.5"); !strings.Contains(body, `"digest":"`+b.Digest+`"`) || len(b.Digest) != 64 {
		t.Errorf("digest missing: %s (want %s)", body, b.Digest)
	}
	if code, _ := get("/v1/bindings?ip=198.18.0.6"); code != 404 {
		t.Errorf("unknown binding: %d", code)
	}
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, "corral_gateway_bindings 1") {
		t.Errorf("metrics: %s", body)
	}
}
