package proxy

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"corral.dev/gateway/internal/bindings"
	"corral.dev/gateway/internal/policy"
	"corral.dev/gateway/internal/records"
)

const (
	agentIP  = "127.0.0.10"
	upstream = "127.0.0.2" // treated as public (--allow-range)
	private  = "127.0.0.3" // stays refused
)

// scriptedDNS answers each name from a list, one answer per lookup (the last repeats).
type scriptedDNS struct {
	mu      sync.Mutex
	answers map[string][]string
	calls   atomic.Int32
}

func (d *scriptedDNS) Resolve(_ context.Context, name string) ([]netip.Addr, error) {
	d.calls.Add(1)
	d.mu.Lock()
	defer d.mu.Unlock()
	list := d.answers[name]
	if len(list) == 0 {
		return nil, fmt.Errorf("no such host %s", name)
	}
	answer := list[0]
	if len(list) > 1 {
		d.answers[name] = list[1:]
	}
	return []netip.Addr{netip.MustParseAddr(answer)}, nil
}

type rig struct {
	addr    string
	gw      *Gateway
	store   *bindings.Store
	records *records.Store
	dns     *scriptedDNS
	log     *strings.Builder
	logMu   sync.Mutex
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func digest(s string) string {
	d := sha256.Sum256([]byte(s))
	return hex.EncodeToString(d[:])
}

func bind(t *testing.T, store *bindings.Store, uid string, created time.Time, agentRules, custodianRules string) {
	t.Helper()
	raw := fmt.Sprintf(`{"v":1,"namespace":"ns","session":"s-%s","agent":"coder","credentialSha256":%q,"agentRules":%s,"custodianRules":%s,"checkoutRules":[]}`,
		uid, digest("cred-"+uid), agentRules, custodianRules)
	b, err := bindings.Parse(uid, []byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	store.Put("test", bindings.Claim{UID: uid, Addrs: []netip.Addr{netip.MustParseAddr(agentIP)}, Created: created, Binding: b})
}

func startRig(t *testing.T, answers map[string][]string) *rig {
	t.Helper()
	r := &rig{store: bindings.NewStore(), records: records.NewStore(nil), dns: &scriptedDNS{answers: answers}, log: &strings.Builder{}}
	gw, err := New(Config{
		Bindings: r.store, Records: r.records, Resolver: r.dns,
		Ranges:         policy.NewRanges(nil, []netip.Prefix{netip.MustParsePrefix(upstream + "/32")}),
		ConnectTimeout: 2 * time.Second, IdleTimeout: 10 * time.Second,
		DecisionLog: lockedWriter{&r.logMu, r.log}, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: gw}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	r.addr = ln.Addr().String()
	r.gw = gw
	return r
}

// echoServer answers each HTTP request with what it saw: the Host and whether a
// Proxy-Authorization or X-Upstream-Https-Proxy header arrived.
func echoServer(t *testing.T, ip string) string {
	t.Helper()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "host=%s auth=%q upstream=%q body=%d", r.Host, r.Header.Get("Proxy-Authorization"),
			r.Header.Get("X-Upstream-Https-Proxy"), len(body))
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

func dialFrom(t *testing.T, source, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}, Timeout: 2 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(5 * time.Second))
	return c
}

// send writes a raw request and answers the status line, the headers and the reader.
func send(t *testing.T, c net.Conn, request string) (string, http.Header, *bufio.Reader) {
	t.Helper()
	if _, err := io.WriteString(c, request); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	status, err := br.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	header := http.Header{}
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			break
		}
		k, v, _ := strings.Cut(line, ":")
		header.Add(k, strings.TrimSpace(v))
	}
	return strings.TrimRight(status, "\r\n"), header, br
}

func basic(password string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte("custodian:"+password))
}

func port(addr string) string { _, p, _ := net.SplitHostPort(addr); return p }

func TestPlainHTTPForwardsWithoutTheCredentialAndKeepsTheHost(t *testing.T) {
	up := echoServer(t, upstream)
	r := startRig(t, map[string][]string{"up.test": {upstream}})
	bind(t, r.store, "a", time.Unix(1, 0), `[]`, fmt.Sprintf(`[{"host":"up.test","ports":[%s]}]`, port(up)))
	c := dialFrom(t, agentIP, r.addr)
	status, _, br := send(t, c, fmt.Sprintf("POST http://up.test:%s/x HTTP/1.1\r\nHost: up.test:%s\r\nProxy-Authorization: %s\r\n"+
		"X-Upstream-Https-Proxy: http://evil.example:1\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello", port(up), port(up), basic("cred-a")))
	body, _ := io.ReadAll(br)
	if !strings.Contains(status, " 200 ") {
		t.Fatalf("%s %s", status, body)
	}
	want := fmt.Sprintf(`host=up.test:%s auth="" upstream="" body=5`, port(up))
	if string(body) != want {
		t.Fatalf("upstream saw %s, want %s", body, want)
	}
	rep, _ := r.records.Session(records.SessionKey{Namespace: "ns", Session: "s-a"})
	if len(rep.Hosts) != 1 || rep.Hosts[0].Identity != "custodian" || rep.Hosts[0].BytesUp != 5 || rep.Hosts[0].BytesDown == 0 {
		t.Fatalf("%+v", rep)
	}
	if strings.Contains(r.log.String(), "cred-a") || !strings.Contains(r.log.String(), `"decision":"allowed"`) {
		t.Fatalf("decision log: %s", r.log.String())
	}
}

func TestRebindingNameIsDialledAtTheCheckedAddress(t *testing.T) {
	up := echoServer(t, upstream)
	// The first answer is the public one; any later lookup would answer loopback.
	r := startRig(t, map[string][]string{"flip.test": {upstream, "127.0.0.1"}})
	bind(t, r.store, "a", time.Unix(1, 0), fmt.Sprintf(`[{"host":"flip.test","ports":[%s]}]`, port(up)), `[]`)
	c := dialFrom(t, agentIP, r.addr)
	status, _, br := send(t, c, fmt.Sprintf("CONNECT flip.test:%s HTTP/1.1\r\nHost: flip.test:%s\r\n\r\n", port(up), port(up)))
	if !strings.Contains(status, " 200 ") {
		t.Fatal(status)
	}
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: flip.test\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if !strings.HasPrefix(string(body), "host=flip.test") {
		t.Fatalf("through the tunnel: %s", body)
	}
	if n := r.dns.calls.Load(); n != 1 {
		t.Fatalf("the name was looked up %d times, want once", n)
	}
}

func TestRefusalsCarryTheReason(t *testing.T) {
	r := startRig(t, map[string][]string{"up.test": {upstream}, "loop.test": {"127.0.0.1"}})
	bind(t, r.store, "a", time.Unix(1, 0), `[{"host":"loop.test","ports":[]},{"host":"up.test","ports":[1]}]`, `[]`)
	for name, tc := range map[string]struct {
		request, status, reason string
	}{
		"not allowed": {"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n",
			`HTTP/1.1 403 Corral egress: pypi.org:443 is not allowed for agent "coder" (add it to the Agent's sandbox.egress)`, "not-allowed"},
		"private":  {"CONNECT loop.test:443 HTTP/1.1\r\n\r\n", "HTTP/1.1 403 Corral egress: loop.test:443 is not allowed", "private-address"},
		"forged":   {"CONNECT up.test:1 HTTP/1.1\r\nProxy-Authorization: " + basic("guess") + "\r\n\r\n", "HTTP/1.1 407 ", "bad-credential"},
		"bad host": {"CONNECT 2852039166:443 HTTP/1.1\r\n\r\n", "HTTP/1.1 403 ", "bad-host"},
		// port 1 on the upstream address: nothing listens
		"unreachable":       {"CONNECT up.test:1 HTTP/1.1\r\n\r\n", "HTTP/1.1 502 Corral egress: up.test:1 could not be reached", "upstream-unreachable"},
		"plain unreachable": {"GET http://up.test:1/ HTTP/1.1\r\nHost: up.test:1\r\n\r\n", "HTTP/1.1 502 Corral egress: GET http://up.test:1 could not be reached", "upstream-unreachable"},
	} {
		c := dialFrom(t, agentIP, r.addr)
		status, header, _ := send(t, c, tc.request)
		if !strings.HasPrefix(status, tc.status) || header.Get("X-Corral-Egress-Reason") != tc.reason {
			t.Errorf("%s: %q %q", name, status, header.Get("X-Corral-Egress-Reason"))
		}
	}
	c := dialFrom(t, "127.0.0.11", r.addr)
	if status, header, _ := send(t, c, "CONNECT up.test:1 HTTP/1.1\r\n\r\n"); header.Get("X-Corral-Egress-Reason") != "unknown-source" {
		t.Errorf("unknown source: %s", status)
	}
}

func TestPrivateRuleGoesThroughTheExemptEngine(t *testing.T) {
	up := echoServer(t, private)
	r := startRig(t, map[string][]string{"internal.test": {private}})
	bind(t, r.store, "a", time.Unix(1, 0), fmt.Sprintf(`[{"host":"internal.test","ports":[%s]}]`, port(up)),
		fmt.Sprintf(`[{"host":"internal.test","ports":[%s],"private":true}]`, port(up)))
	req := fmt.Sprintf("GET http://internal.test:%s/ HTTP/1.1\r\nHost: internal.test\r\nConnection: close\r\n", port(up))
	status, _, _ := send(t, dialFrom(t, agentIP, r.addr), req+"\r\n")
	if !strings.Contains(status, "403") {
		t.Fatalf("the agent's plain rule reached a private address: %s", status)
	}
	status, _, _ = send(t, dialFrom(t, agentIP, r.addr), req+"Proxy-Authorization: "+basic("cred-a")+"\r\n\r\n")
	if !strings.Contains(status, " 200 ") {
		t.Fatalf("the custodian's private rule: %s", status)
	}
}

func TestANewPodOnTheAddressGetsOnlyItsOwnRules(t *testing.T) {
	up := echoServer(t, upstream)
	r := startRig(t, map[string][]string{"up.test": {upstream}})
	rule := fmt.Sprintf(`[{"host":"up.test","ports":[%s]}]`, port(up))
	bind(t, r.store, "old", time.Unix(1, 0), rule, `[]`)
	req := fmt.Sprintf("CONNECT up.test:%s HTTP/1.1\r\n\r\n", port(up))
	if status, _, _ := send(t, dialFrom(t, agentIP, r.addr), req); !strings.Contains(status, " 200 ") {
		t.Fatal(status)
	}
	bind(t, r.store, "new", time.Unix(2, 0), `[]`, `[]`)
	if status, _, _ := send(t, dialFrom(t, agentIP, r.addr), req); !strings.Contains(status, "403") {
		t.Fatalf("the new pod got the old pod's rule: %s", status)
	}
	// The old pod's credential is not the new pod's either.
	status, _, _ := send(t, dialFrom(t, agentIP, r.addr), fmt.Sprintf("CONNECT up.test:%s HTTP/1.1\r\nProxy-Authorization: %s\r\n\r\n", port(up), basic("cred-old")))
	if !strings.Contains(status, "407") {
		t.Fatalf("old credential on the new pod: %s", status)
	}
}

func TestTheEngineRangeCheckIsASecondOpinion(t *testing.T) {
	up := echoServer(t, private)
	r := &rig{store: bindings.NewStore(), records: records.NewStore(nil), dns: &scriptedDNS{answers: map[string][]string{"p.test": {private}}}, log: &strings.Builder{}}
	// A policy that (wrongly) refuses nothing: the engine's own check still refuses loopback.
	gw, err := New(Config{
		Bindings: r.store, Records: r.records, Resolver: r.dns, Ranges: policy.Ranges{},
		ConnectTimeout: time.Second, DecisionLog: io.Discard, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	srv := &http.Server{Handler: gw}
	go srv.Serve(ln)
	defer srv.Close()
	bind(t, r.store, "a", time.Unix(1, 0), fmt.Sprintf(`[{"host":"p.test","ports":[%s]}]`, port(up)), `[]`)
	status, header, _ := send(t, dialFrom(t, agentIP, ln.Addr().String()), fmt.Sprintf("CONNECT p.test:%s HTTP/1.1\r\n\r\n", port(up)))
	if !strings.HasPrefix(status, "HTTP/1.1 403 Corral egress: p.test") || header.Get("X-Corral-Egress-Reason") != "private-address" {
		t.Fatalf("%s %v", status, header)
	}
	rep, _ := r.records.Session(records.SessionKey{Namespace: "ns", Session: "s-a"})
	if len(rep.Hosts) != 1 || rep.Hosts[0].Decision != "denied" {
		t.Fatalf("%+v", rep)
	}
}

// trickleServer writes one line every `every`, `lines` times, to each connection, then closes
// it: a model's answer streaming.
func trickleServer(t *testing.T, ip string, every time.Duration, lines int) string {
	t.Helper()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				for i := 0; i < lines; i++ {
					time.Sleep(every)
					if _, err := fmt.Fprintf(c, "line %d\n", i); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func openTunnel(t *testing.T, r *rig, up string) *bufio.Reader {
	t.Helper()
	c := dialFrom(t, agentIP, r.addr)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	status, _, br := send(t, c, fmt.Sprintf("CONNECT up.test:%s HTTP/1.1\r\nHost: up.test:%s\r\n\r\n", port(up), port(up)))
	if !strings.Contains(status, " 200 ") {
		t.Fatal(status)
	}
	return br
}

func TestDrainLetsABusyTunnelFinishAndClosesAQuietOne(t *testing.T) {
	defer func(was time.Duration) { activityStep = was }(activityStep)
	activityStep = 50 * time.Millisecond
	busy := trickleServer(t, upstream, 100*time.Millisecond, 15) // 1.5 s of answer
	quiet := trickleServer(t, upstream, time.Hour, 1)            // says nothing
	r := startRig(t, map[string][]string{"up.test": {upstream}})
	rules := fmt.Sprintf(`[{"host":"up.test","ports":[%s,%s]}]`, port(busy), port(quiet))
	bind(t, r.store, "a", time.Unix(1, 0), rules, `[]`)
	streaming, idle := openTunnel(t, r, busy), openTunnel(t, r, quiet)

	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	drained := make(chan int, 1)
	go func() { drained <- r.gw.Drain(ctx, 400*time.Millisecond) }()
	if _, err := idle.ReadString('\n'); err == nil {
		t.Fatal("the quiet tunnel carried a line")
	} else if took := time.Since(start); took > time.Second {
		t.Fatalf("the quiet tunnel was closed after %s, want about 0.4 s", took)
	}
	answer, err := io.ReadAll(streaming)
	if err != nil {
		t.Fatalf("the busy tunnel was cut: %v after %q", err, answer)
	}
	if got := strings.Count(string(answer), "\n"); got != 15 {
		t.Fatalf("the busy tunnel carried %d of 15 lines: %q", got, answer)
	}
	if cut := <-drained; cut != 0 {
		t.Fatalf("%d tunnels were cut at the end, want none", cut)
	}
	if n := r.gw.OpenConnections(); n != 0 {
		t.Fatalf("%d connections still open", n)
	}
}

func TestDrainClosesWhatIsStillBusyWhenItsTimeIsUp(t *testing.T) {
	busy := trickleServer(t, upstream, 50*time.Millisecond, 1000)
	r := startRig(t, map[string][]string{"up.test": {upstream}})
	bind(t, r.store, "a", time.Unix(1, 0), fmt.Sprintf(`[{"host":"up.test","ports":[%s]}]`, port(busy)), `[]`)
	streaming := openTunnel(t, r, busy)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if cut := r.gw.Drain(ctx, time.Minute); cut != 1 {
		t.Fatalf("%d tunnels cut at the end, want 1", cut)
	}
	if _, err := io.ReadAll(streaming); err != nil && !strings.Contains(err.Error(), "reset") {
		t.Fatalf("reading the cut tunnel: %v", err)
	}
}

// A client that sends but never reads ends its tunnel after the idle timeout, however short
// the splice's activity step: the time the blocked write towards it waited counts whole.
func TestATunnelWhoseClientTakesNothingEndsAfterTheIdleTimeout(t *testing.T) {
	defer func(was time.Duration) { activityStep = was }(activityStep)
	activityStep = 10 * time.Millisecond
	ln, err := net.Listen("tcp", upstream+":0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() { // reads all it is sent and answers without end
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		go io.Copy(io.Discard, c)
		chunk := make([]byte, 64<<10)
		for {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	}()
	up := ln.Addr().String()
	r := startRig(t, map[string][]string{"up.test": {upstream}})
	r.gw.cfg.IdleTimeout = 200 * time.Millisecond
	bind(t, r.store, "a", time.Unix(1, 0), fmt.Sprintf(`[{"host":"up.test","ports":[%s]}]`, port(up)), `[]`)
	c := dialFrom(t, agentIP, r.addr)
	if status, _, _ := send(t, c, fmt.Sprintf("CONNECT up.test:%s HTTP/1.1\r\n\r\n", port(up))); !strings.Contains(status, " 200 ") {
		t.Fatal(status)
	}
	c.SetDeadline(time.Time{})
	go func() { // sends without end, reads nothing
		for {
			if _, err := c.Write([]byte("more\n")); err != nil {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	start := time.Now()
	for r.gw.OpenConnections() != 0 {
		if time.Since(start) > 2*time.Second {
			t.Fatalf("the tunnel still open after %s with an idle timeout of 200ms", time.Since(start))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
