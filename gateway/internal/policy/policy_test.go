package policy

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"net/netip"
	"testing"
)

// fakeDNS answers from a map and counts the lookups.
type fakeDNS struct {
	answers map[string][]string
	calls   int
}

func (d *fakeDNS) Resolve(_ context.Context, name string) ([]netip.Addr, error) {
	d.calls++
	raw, ok := d.answers[name]
	if !ok {
		return nil, errors.New("no such host")
	}
	out := make([]netip.Addr, len(raw))
	for i, r := range raw {
		out[i] = netip.MustParseAddr(r)
	}
	return out, nil
}

func rules(t *testing.T, raw ...string) []Rule {
	t.Helper()
	out := make([]Rule, len(raw))
	for i, r := range raw {
		rule, err := ParseRule([]byte(r))
		if err != nil {
			t.Fatalf("rule %s: %v", r, err)
		}
		out[i] = rule
	}
	return out
}

func host(t *testing.T, raw string) Host {
	t.Helper()
	h, err := ParseHost(raw)
	if err != nil {
		t.Fatalf("host %q: %v", raw, err)
	}
	return h
}

func TestParseHostNormalisesAndRefusesOtherSpellings(t *testing.T) {
	for raw, want := range map[string]string{
		"PyPI.org":                 "pypi.org",
		"pypi.org.":                "pypi.org",
		"xn--bcher-kva.example":    "xn--bcher-kva.example",
		"203.0.113.7":              "203.0.113.7",
		"[2001:DB8::1]":            "2001:db8::1",
		"[::ffff:169.254.169.254]": "169.254.169.254", // mapped: judged as its IPv4 address
		"[::ffff:a9fe:a9fe]":       "169.254.169.254",
		"169.254.169.254.":         "169.254.169.254",
		"a_b.example":              "a_b.example",
		"1password.com":            "1password.com",
	} {
		if got := host(t, raw).String(); got != want {
			t.Errorf("ParseHost(%q) = %q, want %q", raw, got, want)
		}
	}
	for _, raw := range []string{
		"", "pypi.org..", "bücher.example", "a b", "-a.example", "a-.example", "2001:db8::1",
		"[203.0.113.7]", "[fe80::1%eth0]", "2852039166", "0251.0376.0251.0376", "0xa9fea9fe",
		"169.254.43518", "0xA9.0xFE.0xA9.0xFE", "169.254.169.0254", "evil.example/x",
	} {
		if h, err := ParseHost(raw); err == nil {
			t.Errorf("ParseHost(%q) = %v, want a bad host", raw, h)
		}
	}
}

func TestParseAuthority(t *testing.T) {
	h, port, err := ParseAuthority("[2001:db8::1]:8443")
	if err != nil || h.String() != "2001:db8::1" || port != 8443 {
		t.Fatalf("got %v %d %v", h, port, err)
	}
	for _, bad := range []string{"pypi.org", "pypi.org:", "pypi.org:0", "pypi.org:65536", "pypi.org:+1", "pypi.org:0443", "[::1]"} {
		if _, _, err := ParseAuthority(bad); err == nil {
			t.Errorf("ParseAuthority(%q) accepted", bad)
		}
	}
	if _, port, err := ParseURLHost("docs.example.com"); err != nil || port != 80 {
		t.Fatalf("a URL host without a port is port 80: %d %v", port, err)
	}
}

func TestParseRuleRefusesMalformedRules(t *testing.T) {
	for _, raw := range []string{
		`{}`, `{"host":"a.example","cidr":"10.0.0.0/8"}`, `{"host":"*.","ports":[]}`,
		`{"host":"a b"}`, `{"cidr":"10.0.0.0/33"}`, `{"host":"a.example","ports":[0]}`,
		`{"host":"a.example","methods":["get"]}`, `[]`,
	} {
		if _, err := ParseRule([]byte(raw)); err == nil {
			t.Errorf("ParseRule(%s) accepted", raw)
		}
	}
}

func decide(t *testing.T, rs []Rule, raw string, port uint16, method string, dns *fakeDNS) Verdict {
	t.Helper()
	if dns == nil {
		dns = &fakeDNS{}
	}
	return Decide(context.Background(), rs, Request{Host: host(t, raw), Port: port, Method: method}, NewRanges(nil, nil), dns)
}

func TestHostRulesExactAndWildcard(t *testing.T) {
	dns := &fakeDNS{answers: map[string][]string{
		"pypi.org": {"151.101.0.223"}, "a.pypi.org": {"151.101.0.224"}, "a.b.pypi.org": {"151.101.0.225"},
		"xpypi.org": {"203.0.113.1"}, "pypi.org.evil.com": {"203.0.113.2"},
	}}
	wild := rules(t, `{"host":"*.pypi.org","ports":[]}`)
	for name, allowed := range map[string]bool{
		"a.pypi.org": true, "a.b.pypi.org": true, "A.PyPI.org.": true,
		"pypi.org": false, "xpypi.org": false, "pypi.org.evil.com": false,
	} {
		v := decide(t, wild, name, 443, "", dns)
		if v.Allowed() != allowed {
			t.Errorf("*.pypi.org vs %s: %+v", name, v)
		}
		if !allowed && v.Reason != NotAllowed {
			t.Errorf("%s: reason %s", name, v.Reason)
		}
	}
	exact := rules(t, `{"host":"PyPI.org.","ports":[]}`)
	if v := decide(t, exact, "pypi.org", 443, "", dns); !v.Allowed() || v.Dial.String() != "151.101.0.223:443" {
		t.Errorf("exact rule: %+v", v)
	}
	if v := decide(t, exact, "a.pypi.org", 443, "", dns); v.Allowed() {
		t.Errorf("an exact rule matched a subdomain")
	}
}

func TestUnmatchedNameIsRefusedWithoutALookup(t *testing.T) {
	dns := &fakeDNS{answers: map[string][]string{"other.example": {"203.0.113.9"}}}
	v := decide(t, rules(t, `{"host":"pypi.org","ports":[]}`), "other.example", 443, "", dns)
	if v.Reason != NotAllowed || dns.calls != 0 {
		t.Fatalf("%+v after %d lookups", v, dns.calls)
	}
}

func TestPorts(t *testing.T) {
	dns := &fakeDNS{answers: map[string][]string{"pypi.org": {"151.101.0.223"}}}
	def := rules(t, `{"host":"pypi.org","ports":[]}`)
	if !decide(t, def, "pypi.org", 443, "", dns).Allowed() {
		t.Error("empty ports on a host rule should mean 443")
	}
	if v := decide(t, def, "pypi.org", 8443, "", dns); v.Reason != PortNotAllowed || v.Detail != "443" {
		t.Errorf("port 8443: %+v", v)
	}
	listed := rules(t, `{"host":"pypi.org","ports":[80,8080]}`)
	if decide(t, listed, "pypi.org", 443, "", dns).Reason != PortNotAllowed {
		t.Error("listed ports exclude 443")
	}
	if !decide(t, listed, "pypi.org", 8080, "", dns).Allowed() {
		t.Error("8080 is listed")
	}
	cidr := rules(t, `{"cidr":"203.0.113.0/24","ports":[]}`)
	for _, port := range []uint16{22, 443, 9418} {
		if !decide(t, cidr, "203.0.113.7", port, "", nil).Allowed() {
			t.Errorf("empty ports on a cidr rule should mean every port (%d)", port)
		}
	}
}

func TestMethods(t *testing.T) {
	dns := &fakeDNS{answers: map[string][]string{"docs.example.com": {"203.0.113.5"}}}
	rs := rules(t, `{"host":"docs.example.com","ports":[80],"methods":["GET","HEAD"]}`)
	if !decide(t, rs, "docs.example.com", 80, "GET", dns).Allowed() {
		t.Error("GET is listed")
	}
	if v := decide(t, rs, "docs.example.com", 80, "POST", dns); v.Reason != MethodNotAllowed || v.Detail != "GET, HEAD" {
		t.Errorf("POST: %+v", v)
	}
	if v := decide(t, rs, "docs.example.com", 80, "", dns); v.Reason != MethodNotAllowed {
		t.Errorf("a CONNECT must never match a rule with methods: %+v", v)
	}
	any := rules(t, `{"host":"docs.example.com","ports":[80]}`)
	if !decide(t, any, "docs.example.com", 80, "DELETE", dns).Allowed() || !decide(t, any, "docs.example.com", 80, "", dns).Allowed() {
		t.Error("no methods means any method, CONNECT included")
	}
}

func TestCIDRRulesMatchTheResolvedAddress(t *testing.T) {
	dns := &fakeDNS{answers: map[string][]string{"in.example": {"203.0.113.20"}, "out.example": {"198.51.100.1"}}}
	rs := rules(t, `{"cidr":"203.0.113.0/24","ports":[443]}`)
	if v := decide(t, rs, "in.example", 443, "", dns); !v.Allowed() || v.Dial.String() != "203.0.113.20:443" {
		t.Errorf("in.example: %+v", v)
	}
	if v := decide(t, rs, "out.example", 443, "", dns); v.Reason != NotAllowed {
		t.Errorf("out.example: %+v", v)
	}
	if !decide(t, rs, "203.0.113.99", 443, "", nil).Allowed() {
		t.Error("an IP literal inside the cidr")
	}
}

func TestIPv4LiteralHostRule(t *testing.T) {
	rs := rules(t, `{"host":"203.0.113.7","ports":[]}`)
	if !decide(t, rs, "203.0.113.7", 443, "", nil).Allowed() {
		t.Error("the literal")
	}
	if decide(t, rs, "203.0.113.8", 443, "", nil).Allowed() {
		t.Error("another address")
	}
	dns := &fakeDNS{answers: map[string][]string{"seven.example": {"203.0.113.7"}}}
	if decide(t, rs, "seven.example", 443, "", dns).Allowed() {
		t.Error("a literal host rule names the literal, not names that resolve to it")
	}
}

func TestRefusedRanges(t *testing.T) {
	open := rules(t, `{"cidr":"0.0.0.0/0","ports":[]}`, `{"cidr":"::/0","ports":[]}`)
	for _, raw := range []string{
		"127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "100.64.0.1", "169.254.169.254",
		"0.1.2.3", "224.0.0.1", "240.0.0.1", "255.255.255.255", "198.18.0.1", "198.19.255.1",
		"[::1]", "[fd00::1]", "[fe80::1]", "[ff02::1]", "[::ffff:127.0.0.1]", "[::ffff:169.254.169.254]",
		"[::ffff:a9fe:a9fe]", "[64:ff9b::a9fe:a9fe]", "[2002:a9fe:a9fe::1]", "[::a9fe:a9fe]",
	} {
		if v := decide(t, open, raw, 80, "", nil); v.Reason != PrivateAddress {
			t.Errorf("%s through 0.0.0.0/0: %+v", raw, v)
		}
	}
	for _, raw := range []string{"203.0.113.7", "8.8.8.8", "[2001:db8::1]"} {
		if !decide(t, open, raw, 80, "", nil).Allowed() {
			t.Errorf("%s is public", raw)
		}
	}
}

func TestPrivateReachableOnlyWhenARuleNamesIt(t *testing.T) {
	dns := &fakeDNS{answers: map[string][]string{"api.internal": {"10.0.0.5"}, "kube.local": {"198.19.0.1"}}}
	user := rules(t, `{"host":"api.internal","ports":[]}`)
	if v := decide(t, user, "api.internal", 443, "", dns); v.Reason != PrivateAddress || v.Detail != "10.0.0.5" {
		t.Errorf("a user's host rule must not reach a private address: %+v", v)
	}
	platform := rules(t, `{"host":"api.internal","ports":[],"private":true}`)
	if v := decide(t, platform, "api.internal", 443, "", dns); !v.Allowed() || !v.Exempt {
		t.Errorf("a private rule reaches it (exempt): %+v", v)
	}
	literal := rules(t, `{"host":"10.0.0.5","ports":[]}`)
	if !decide(t, literal, "10.0.0.5", 443, "", nil).Allowed() {
		t.Error("a user who wrote the address reaches it")
	}
	inside := rules(t, `{"cidr":"10.0.0.0/24","ports":[]}`)
	if !decide(t, inside, "10.0.0.9", 5432, "", nil).Allowed() {
		t.Error("a cidr inside a refused range was written on purpose")
	}
	straddling := rules(t, `{"cidr":"10.0.0.0/7","ports":[]}`)
	if decide(t, straddling, "10.0.0.9", 443, "", nil).Allowed() {
		t.Error("a cidr wider than the refused range does not name its addresses")
	}
	serviceRange := Decide(context.Background(), rules(t, `{"cidr":"0.0.0.0/0","ports":[]}`),
		Request{Host: host(t, "203.0.113.77"), Port: 443}, NewRanges([]netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}, nil), dns)
	if serviceRange.Reason != PrivateAddress {
		t.Errorf("--deny-cidr adds a refused range: %+v", serviceRange)
	}
	allowRange := Decide(context.Background(), rules(t, `{"host":"api.internal","ports":[]}`),
		Request{Host: host(t, "api.internal"), Port: 443}, NewRanges(nil, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}), dns)
	if !allowRange.Allowed() || allowRange.Exempt {
		t.Errorf("--allow-range treats the address as public: %+v", allowRange)
	}
}

func TestRebindingIsCheckedOnceAndTheCheckedAddressIsDialled(t *testing.T) {
	dns := &fakeDNS{answers: map[string][]string{
		"rebind.example": {"127.0.0.1"},
		"mixed.example":  {"10.0.0.1", "203.0.113.50", "127.0.0.1"},
	}}
	rs := rules(t, `{"host":"rebind.example","ports":[]}`, `{"host":"mixed.example","ports":[]}`)
	if v := decide(t, rs, "rebind.example", 443, "", dns); v.Reason != PrivateAddress {
		t.Errorf("a name resolving to loopback: %+v", v)
	}
	dns.calls = 0
	v := decide(t, rs, "mixed.example", 443, "", dns)
	if !v.Allowed() || v.Dial.String() != "203.0.113.50:443" || v.Exempt {
		t.Errorf("of several addresses the one to dial is a checked public one: %+v", v)
	}
	if dns.calls != 1 {
		t.Errorf("resolved %d times, want once", dns.calls)
	}
}

func TestMoreSpecificReasonWins(t *testing.T) {
	dns := &fakeDNS{answers: map[string][]string{"a.example": {"203.0.113.1"}}}
	rs := rules(t, `{"host":"a.example","ports":[80],"methods":["GET"]}`, `{"cidr":"203.0.113.0/24","ports":[22]}`)
	if v := decide(t, rs, "a.example", 80, "POST", dns); v.Reason != MethodNotAllowed {
		t.Errorf("%+v", v)
	}
	if v := decide(t, rs, "a.example", 443, "", dns); v.Reason != PortNotAllowed {
		t.Errorf("%+v", v)
	}
}

func TestUnresolvableName(t *testing.T) {
	rs := rules(t, `{"host":"gone.example","ports":[]}`)
	if v := decide(t, rs, "gone.example", 443, "", &fakeDNS{}); v.Reason != Unreachable || v.Reason.Status() != 502 {
		t.Errorf("%+v", v)
	}
}

func TestMessagesSayWhatToDo(t *testing.T) {
	req := Request{Host: host(t, "pypi.org"), Port: 443}
	msg := Verdict{Reason: NotAllowed}.Message(Who{Identity: IdentityAgent, Agent: "coder"}, req)
	want := `Corral egress: pypi.org:443 is not allowed for agent "coder" (add it to the Agent's sandbox.egress)`
	if msg != want {
		t.Errorf("got %q", msg)
	}
}

func basic(user, password string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+password))
}

func digest(s string) string {
	d := sha256.Sum256([]byte(s))
	return hex.EncodeToString(d[:])
}

func TestIdentify(t *testing.T) {
	d := digest("s3cret")
	if id, err := Identify(d, nil); id != IdentityAgent || err != nil {
		t.Errorf("no header is the agent: %s %v", id, err)
	}
	if id, err := Identify(d, []string{basic("custodian", "s3cret")}); id != IdentityCustodian || err != nil {
		t.Errorf("the credential is the custodian: %s %v", id, err)
	}
	for name, headers := range map[string][]string{
		"forged":    {basic("custodian", "guess")},
		"rotated":   {basic("custodian", "old-secret")},
		"malformed": {"Basic !!!"},
		"no colon":  {"Basic " + base64.StdEncoding.EncodeToString([]byte("s3cret"))},
		"bearer":    {"Bearer s3cret"},
		"two":       {basic("custodian", "s3cret"), basic("custodian", "s3cret")},
		"empty":     {""},
	} {
		if id, err := Identify(d, headers); err == nil {
			t.Errorf("%s: served as %s", name, id)
		}
	}
	if _, err := Identify("", []string{basic("custodian", "")}); err == nil {
		t.Error("a binding without a digest has no custodian")
	}
}

// relativeDNS records whether each lookup was allowed the system's search domains.
type relativeDNS struct{ relative []bool }

func (d *relativeDNS) Resolve(ctx context.Context, _ string) ([]netip.Addr, error) {
	d.relative = append(d.relative, RelativeNames(ctx))
	return []netip.Addr{netip.MustParseAddr("198.19.0.1")}, nil
}

func TestOnlyAPlatformNamedHostMayResolveRelativeToTheCluster(t *testing.T) {
	dns := &relativeDNS{}
	platform := rules(t, `{"host":"kubernetes.default.svc","ports":[443],"private":true}`)
	user := rules(t, `{"host":"kubernetes.default.svc","ports":[443]}`)
	req := Request{Host: host(t, "kubernetes.default.svc"), Port: 443}
	if v := Decide(context.Background(), platform, req, NewRanges(nil, nil), dns); !v.Dial.IsValid() {
		t.Fatalf("the platform's rule should reach its private address: %+v", v)
	}
	if v := Decide(context.Background(), user, req, NewRanges(nil, nil), dns); v.Dial.IsValid() {
		t.Fatalf("a user's rule must not reach a private address: %+v", v)
	}
	if len(dns.relative) != 2 || !dns.relative[0] || dns.relative[1] {
		t.Fatalf("relative lookups: %v, want [true false]", dns.relative)
	}
}
