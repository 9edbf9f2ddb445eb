package records

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

var coder = Who{Known: true, Namespace: "ns", Session: "s1", Agent: "coder", Identity: "agent"}

func TestHitsAndBytes(t *testing.T) {
	c := &clock{t: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
	s := NewStore(c.now)
	e := s.Hit(coder, "pypi.org", 443, "allowed", "")
	e.AddUp(10)
	e.AddDown(1000)
	c.t = c.t.Add(time.Minute)
	s.Hit(coder, "pypi.org", 443, "allowed", "")
	s.Hit(coder, "evil.example", 443, "denied", "not-allowed")
	rep, ok := s.Session(SessionKey{"ns", "s1"})
	if !ok || len(rep.Hosts) != 2 || rep.Agent != "coder" {
		t.Fatalf("%+v", rep)
	}
	allowed := rep.Hosts[1]
	if allowed.Host != "pypi.org" || allowed.Count != 2 || allowed.BytesUp != 10 || allowed.BytesDown != 1000 ||
		allowed.FirstSeen != "2030-01-02T03:04:05Z" || allowed.LastSeen != "2030-01-02T03:05:05Z" {
		t.Errorf("%+v", allowed)
	}
	if rep.Hosts[0].Reason != "not-allowed" || rep.Hosts[0].Decision != "denied" {
		t.Errorf("%+v", rep.Hosts[0])
	}
	if _, ok := s.Session(SessionKey{"ns", "nope"}); ok {
		t.Error("unknown session")
	}
}

func TestBoundedHostsPerSession(t *testing.T) {
	s := NewStore(nil)
	for i := 0; i < MaxHosts+50; i++ {
		s.Hit(coder, fmt.Sprintf("h%d.example", i), 443, "denied", "not-allowed")
	}
	rep, _ := s.Session(SessionKey{"ns", "s1"})
	if len(rep.Hosts) != MaxHosts+1 || rep.Truncated != 50 {
		t.Fatalf("%d rows, truncated %d", len(rep.Hosts), rep.Truncated)
	}
	other := rep.Hosts[len(rep.Hosts)-1]
	if other.Host != OtherHost || other.Count != 50 {
		t.Errorf("%+v", other)
	}
}

func TestRetentionAfterThePodGoes(t *testing.T) {
	c := &clock{t: time.Unix(0, 0)}
	s := NewStore(c.now)
	s.Hit(coder, "pypi.org", 443, "allowed", "")
	s.SetLive(map[[2]string]bool{})
	c.t = c.t.Add(59 * time.Minute)
	if _, ok := s.Session(SessionKey{"ns", "s1"}); !ok {
		t.Fatal("records dropped before an hour")
	}
	s.SetLive(map[[2]string]bool{{"ns", "s1"}: true}) // the pod came back: kept
	c.t = c.t.Add(2 * time.Hour)
	if _, ok := s.Session(SessionKey{"ns", "s1"}); !ok {
		t.Fatal("a live session's records expired")
	}
	s.SetLive(map[[2]string]bool{})
	c.t = c.t.Add(61 * time.Minute)
	if _, ok := s.Session(SessionKey{"ns", "s1"}); ok {
		t.Fatal("records kept past the hour")
	}
}

func TestMetrics(t *testing.T) {
	s := NewStore(nil)
	s.Hit(coder, "pypi.org", 443, "allowed", "").AddDown(7)
	for i := 0; i < MaxDeniedHostLabels+5; i++ {
		s.Hit(coder, fmt.Sprintf("d%d.example", i), 443, "denied", "not-allowed")
	}
	var buf bytes.Buffer
	s.WriteMetrics(&buf, Gauges{Bindings: 3, Connections: 2, WatchRestart: 1})
	out := buf.String()
	for _, want := range []string{
		`corral_gateway_requests_total{namespace="ns",agent="coder",host="pypi.org",decision="allowed",identity="agent"} 1`,
		`corral_gateway_requests_total{namespace="ns",agent="coder",host="other",decision="denied",identity="agent"} 5`,
		`corral_gateway_bytes_total{namespace="ns",agent="coder",direction="down"} 7`,
		"corral_gateway_bindings 3", "corral_gateway_connections 2", "corral_gateway_watch_restarts_total 1",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %s", want)
		}
	}
	if n := strings.Count(out, `decision="denied"`); n != MaxDeniedHostLabels+1 {
		t.Errorf("%d denied series, want %d", n, MaxDeniedHostLabels+1)
	}
	if quote("a\"b\\c\nd") != `"a\"b\\c\nd"` {
		t.Error(quote("a\"b\\c\nd"))
	}
}
