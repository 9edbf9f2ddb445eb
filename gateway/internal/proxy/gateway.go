// Package proxy is the gateway's proxy port: Corral's policy in front (who the source is,
// which identity, which rule, which checked address), smokescreen behind it as the engine
// that proxies CONNECT and plain HTTP, applies its own range check, dials and times out.
//
// The engine sees a request only once the policy allowed it, with the destination rewritten
// to a pinned name (resolve.Pin) that its resolver maps back to the one address the policy
// checked, so it neither looks a name up nor dials anything else. Its ACL hook and its role
// hook read the policy's verdict from the request's context; its dial hook dials the checked
// address and counts the bytes; its reject hook words every refusal the Corral way.
package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stripe/goproxy"
	"github.com/stripe/smokescreen/pkg/smokescreen"
	acl "github.com/stripe/smokescreen/pkg/smokescreen/acl/v1"
	"github.com/stripe/smokescreen/pkg/smokescreen/conntrack"
	"github.com/stripe/smokescreen/pkg/smokescreen/metrics"

	"corral.dev/gateway/internal/bindings"
	"corral.dev/gateway/internal/policy"
	"corral.dev/gateway/internal/records"
	"corral.dev/gateway/internal/resolve"
)

// Config is what the proxy port needs.
type Config struct {
	Bindings       *bindings.Store
	Records        *records.Store
	Platform       []policy.Rule // every custodian's, besides its binding's
	Ranges         policy.Ranges
	Resolver       policy.Resolver
	ConnectTimeout time.Duration
	IdleTimeout    time.Duration
	// DrainQuiet is how long a tunnel may carry nothing before Drain closes it; a splice
	// reports what it moved at least every quarter of it (at most every 5 s).
	DrainQuiet  time.Duration
	ListenPort  uint16
	DecisionLog io.Writer // one JSON line per decision
	Log         *slog.Logger
}

// Gateway is the proxy port's handler.
type Gateway struct {
	cfg Config
	// strict is the engine for addresses outside the refused ranges: its own range check
	// refuses them too (a second opinion). exempt is the engine for an address a rule let
	// through a refused range (a private rule, or a user who wrote the address).
	strict, exempt *goproxy.ProxyHttpServer
	open           atomic.Int64
	// tunnels holds every CONNECT tunnel open now (*tunnelConn), for Drain.
	tunnels sync.Map
	logMu   sync.Mutex
}

// New builds the two engines.
func New(cfg Config) (*Gateway, error) {
	g := &Gateway{cfg: cfg}
	engineLog := logrus.New()
	engineLog.SetOutput(os.Stderr)
	engineLog.SetLevel(logrus.WarnLevel) // the decision log is ours, on stdout
	engineLog.SetFormatter(&logrus.JSONFormatter{TimestampFormat: time.RFC3339Nano})
	var shuttingDown atomic.Value
	shuttingDown.Store(false)
	tracker := conntrack.NewTracker(cfg.IdleTimeout, metrics.NewNoOpMetricsClient(), engineLog, shuttingDown, nil)
	var err error
	if g.strict, err = g.engine(engineLog, tracker, false); err != nil {
		return nil, err
	}
	if g.exempt, err = g.engine(engineLog, tracker, true); err != nil {
		return nil, err
	}
	return g, nil
}

func (g *Gateway) engine(engineLog *logrus.Logger, tracker *conntrack.Tracker, exempt bool) (*goproxy.ProxyHttpServer, error) {
	c := smokescreen.NewConfig()
	c.Log = engineLog
	c.Port = g.cfg.ListenPort
	c.Resolver = resolve.Pinned{}
	c.ConnectTimeout = g.cfg.ConnectTimeout
	c.IdleTimeout = g.cfg.IdleTimeout
	c.EgressACL = verdictACL{}
	c.RoleFromRequest = roleOf
	c.ProxyDialTimeout = g.dial
	c.RejectResponseHandlerWithCtx = g.rejected
	c.ConnTracker = tracker
	c.MetricsClient.SetStarted()
	if err := c.InitializeSelfConnectionDetection(); err != nil {
		g.cfg.Log.Warn("self-connection detection unavailable", "error", err.Error())
	}
	if exempt {
		if err := c.SetAllowRanges([]string{"0.0.0.0/0", "::/0"}); err != nil {
			return nil, err
		}
	} else {
		if err := c.SetDenyRanges(prefixStrings(g.cfg.Ranges.Refused)); err != nil {
			return nil, err
		}
		if err := c.SetAllowRanges(prefixStrings(g.cfg.Ranges.Allowed)); err != nil {
			return nil, err
		}
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	p := smokescreen.BuildProxy(c)
	p.Tr.Proxy = nil // never chain to a proxy from the gateway's own environment
	p.ConnectCopyHandler = g.copyTunnel
	p.KeepAcceptEncoding = true
	p.Logger = log.New(os.Stderr, "engine: ", log.LstdFlags)
	// After smokescreen's own request handler (which judged the pinned host): the upstream
	// gets the Host the client wrote, while the transport dials the pinned address.
	p.OnRequest().DoFunc(func(req *http.Request, _ *goproxy.ProxyCtx) (*http.Request, *http.Response) {
		if f := flightOf(req); f != nil {
			req.Host = f.clientHost
		}
		return req, nil
	})
	return p, nil
}

func prefixStrings(ps []netip.Prefix) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}

// OpenConnections: upstream connections open now.
func (g *Gateway) OpenConnections() int64 { return g.open.Load() }

type flightKey struct{}

var errNotHTTP = errors.New("not an http:// URL")

func flightOf(r *http.Request) *flight {
	if r == nil {
		return nil
	}
	f, _ := r.Context().Value(flightKey{}).(*flight)
	return f
}

// ServeHTTP judges the request and hands an allowed one to the engine.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	connect := r.Method == http.MethodConnect
	if !connect && !r.URL.IsAbs() {
		http.Error(w, "Corral egress gateway: send proxy requests (CONNECT, or an absolute http:// URL)", http.StatusBadRequest)
		return
	}
	// Headers that would let a client steer the engine (an upstream proxy of its choice, a
	// role) never reach it.
	for name := range r.Header {
		if strings.HasPrefix(strings.ToLower(name), "x-smokescreen-") {
			r.Header.Del(name)
		}
	}
	r.Header.Del(goproxy.PerRequestHTTPSProxyHeaderKey)

	f := &flight{g: g, connect: connect, method: r.Method, clientHost: r.Host}
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		f.source = ap.Addr().Unmap()
	}
	// The destination first, so every refusal's log line and record names it.
	var err error
	switch {
	case connect:
		f.req.Host, f.req.Port, err = policy.ParseAuthority(r.Host)
	case r.URL.Scheme != "http":
		err = errNotHTTP
	default:
		f.req.Host, f.req.Port, err = policy.ParseURLHost(r.URL.Host)
		f.req.Method = r.Method
	}
	if err != nil {
		f.rawHost = r.Host
	}

	f.binding = g.cfg.Bindings.Lookup(f.source)
	if f.binding == nil {
		f.refuse(w, policy.UnknownSource, fmt.Sprintf(
			"Corral egress: %s is not a known sandbox (no Running pod with an egress binding has this address)", f.source))
		return
	}
	f.who = records.Who{Known: true, Namespace: f.binding.Namespace, Session: f.binding.Session, Agent: f.binding.Agent}

	auth := r.Header.Values("Proxy-Authorization")
	r.Header.Del("Proxy-Authorization") // never forwarded
	identity, idErr := policy.Identify(f.binding.CredentialSHA256, auth)
	if idErr != nil {
		f.who.Identity = policy.IdentityCustodian // what the request claimed to be
		f.refuse(w, policy.BadCredential, "Corral egress: "+idErr.Error()+
			" (a stale credential after rotation is refused too; it is never served as the agent's)")
		return
	}
	f.who.Identity = identity

	switch {
	case errors.Is(err, errNotHTTP):
		f.refuse(w, policy.BadRequest, fmt.Sprintf(
			"Corral egress: only http:// URLs are proxied as plain requests, not %s:// (send a CONNECT for TLS)", r.URL.Scheme))
		return
	case err != nil:
		f.refuse(w, policy.BadHost, fmt.Sprintf("Corral egress: %q is not a valid host name or address with a port", r.Host))
		return
	}
	rules := append(append([]policy.Rule{}, f.binding.AgentRules...), f.binding.CheckoutRules...)
	if identity == policy.IdentityCustodian {
		rules = append(append([]policy.Rule{}, f.binding.CustodianRules...), g.cfg.Platform...)
	}
	f.verdict = policy.Decide(r.Context(), rules, f.req, g.cfg.Ranges, g.cfg.Resolver)
	if !f.verdict.Allowed() {
		f.refuse(w, f.verdict.Reason, f.verdict.Message(f.policyWho(), f.req))
		return
	}

	// Allowed: the engine gets the pinned destination.
	f.pinnedHost = resolve.Pin(f.verdict.Dial.Addr())
	pinned := net.JoinHostPort(f.pinnedHost, fmt.Sprint(f.req.Port))
	r = r.WithContext(context.WithValue(r.Context(), flightKey{}, f))
	r.Host = pinned
	r.URL.Host = pinned
	engine := g.strict
	if f.verdict.Exempt {
		engine = g.exempt
	}
	if connect {
		engine.ServeHTTP(w, r)
	} else {
		if r.Body != nil && r.Body != http.NoBody {
			r.Body = &countedBody{ReadCloser: r.Body, f: f}
		}
		engine.ServeHTTP(&plainWriter{ResponseWriter: w, f: f}, r)
	}
	f.finish("denied", policy.Unreachable, "Corral egress: the engine gave no answer") // a no-op once decided
}

func (f *flight) policyWho() policy.Who {
	return policy.Who{Identity: f.who.Identity, Agent: f.binding.Agent, Session: f.binding.Session}
}

// flight is one request's state, from the policy's verdict to its outcome.
type flight struct {
	g          *Gateway
	connect    bool
	method     string
	source     netip.Addr
	binding    *bindings.Binding
	who        records.Who
	req        policy.Request
	rawHost    string
	verdict    policy.Verdict
	clientHost string // the Host the client sent (plain http keeps it upstream)
	pinnedHost string

	once    sync.Once
	mu      sync.Mutex
	entry   *records.Entry
	pending [2]int // bytes before the outcome was recorded (a plain request's body)
	failure *refusal
}

type refusal struct {
	reason  policy.Reason
	message string
}

// finish records the outcome once: the records, the metrics and the decision log line.
func (f *flight) finish(decision string, reason policy.Reason, message string) {
	f.once.Do(func() {
		host, port := f.req.Host.String(), f.req.Port
		if host == "" {
			host = f.rawHost
		}
		e := f.g.cfg.Records.Hit(f.who, host, port, decision, string(reason))
		f.mu.Lock()
		if decision == "allowed" {
			f.entry = e
			e.AddUp(f.pending[0])
			e.AddDown(f.pending[1])
		}
		f.mu.Unlock()
		f.g.logDecision(f, decision, reason, message)
	})
}

func (f *flight) addUp(n int)   { f.add(0, n) }
func (f *flight) addDown(n int) { f.add(1, n) }

func (f *flight) add(dir, n int) {
	if n <= 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.entry == nil:
		f.pending[dir] += n
	case dir == 0:
		f.entry.AddUp(n)
	default:
		f.entry.AddDown(n)
	}
}

// refuse answers a refusal the gateway decided itself.
func (f *flight) refuse(w http.ResponseWriter, reason policy.Reason, message string) {
	f.finish("denied", reason, message)
	writeRefusal(w, reason, message)
}

// verdictACL is the engine's ACL: it allows exactly what the policy allowed, for the pinned
// host the policy chose, and nothing else.
type verdictACL struct{}

func (verdictACL) Decide(args acl.DecideArgs) (acl.Decision, error) {
	f := flightOf(args.Req)
	if f == nil || !f.verdict.Allowed() || args.Host != f.pinnedHost {
		return acl.Decision{Result: acl.Deny, Reason: "not allowed by the Corral policy"}, nil
	}
	return acl.Decision{Result: acl.Allow, Reason: "allowed by the Corral policy"}, nil
}

// roleOf is the engine's role: the identity the policy found.
func roleOf(r *http.Request) (string, error) {
	if f := flightOf(r); f != nil && f.who.Identity != "" {
		return f.who.Identity, nil
	}
	return "", smokescreen.MissingRoleError("no Corral verdict on the request")
}

// dial is the engine's dialer: the checked address only, counted.
func (g *Gateway) dial(ctx context.Context, network, address string, timeout time.Duration) (net.Conn, error) {
	pctx, _ := ctx.Value(goproxy.ProxyContextKey).(*goproxy.ProxyCtx)
	var f *flight
	if pctx != nil {
		f = flightOf(pctx.Req)
	}
	if f == nil || address != f.verdict.Dial.String() {
		return nil, errors.New("the engine asked to dial an address the policy did not check")
	}
	conn, err := net.DialTimeout(network, address, timeout)
	if err != nil {
		var ne net.Error
		reason := policy.Unreachable
		if errors.As(err, &ne) && ne.Timeout() {
			reason = policy.Timeout
		}
		detail := err.Error()
		if op := (*net.OpError)(nil); errors.As(err, &op) && op.Err != nil {
			detail = op.Err.Error()
		}
		v := policy.Verdict{Reason: reason, Detail: fmt.Sprintf("dialling %s: %s", address, detail)}
		f.mu.Lock()
		f.failure = &refusal{reason: reason, message: v.Message(f.policyWho(), f.req)}
		f.mu.Unlock()
		return nil, err
	}
	g.open.Add(1)
	if f.connect {
		f.finish("allowed", policy.Allowed, "")
		f.mu.Lock()
		e := f.entry
		f.mu.Unlock()
		t := &tunnelConn{Conn: conn, g: g, e: e}
		t.touch()
		g.tunnels.Store(t, struct{}{})
		return t, nil
	}
	// A plain request's connection is pooled and may serve later requests: its bytes are
	// counted per request (countedBody, plainWriter), not here.
	return &pooledConn{Conn: conn, g: g}, nil
}

// rejected is the engine's reject hook: every refusal it writes is reworded as Corral's.
func (g *Gateway) rejected(sctx *smokescreen.SmokescreenContext, resp *http.Response) {
	f := flightOf(resp.Request)
	if f == nil {
		return
	}
	f.mu.Lock()
	failure := f.failure
	f.mu.Unlock()
	if failure == nil {
		// The engine refused on its own: its range check disagreed with the policy, or a
		// limit. Say so rather than guess.
		reason, why := policy.PrivateAddress, "the engine's range check refused it"
		switch resp.StatusCode {
		case http.StatusBadGateway:
			reason, why = policy.Unreachable, "the engine could not connect"
		case http.StatusGatewayTimeout:
			reason, why = policy.Timeout, "the engine timed out"
		}
		if sctx != nil && sctx.Decision != nil && sctx.Decision.Reason != "" {
			why += ": " + sctx.Decision.Reason
		}
		failure = &refusal{reason: reason, message: fmt.Sprintf("Corral egress: %s was refused: %s",
			f.req.Host.HostPort(f.req.Port), why)}
		f.mu.Lock()
		f.failure = failure
		f.mu.Unlock()
	}
	f.finish("denied", failure.reason, failure.message)
	code, phrase, header, body := refusalParts(failure.reason, failure.message)
	resp.StatusCode = code
	resp.Status = fmt.Sprintf("%d %s", code, phrase)
	resp.Header = header
	resp.Body = io.NopCloser(strings.NewReader(body))
	resp.ContentLength = int64(len(body))
}

func refusalParts(reason policy.Reason, message string) (int, string, http.Header, string) {
	header := http.Header{}
	header.Set("Content-Type", "text/plain; charset=utf-8")
	header.Set("X-Corral-Egress-Reason", string(reason))
	if reason == policy.BadCredential {
		header.Set("Proxy-Authenticate", `Basic realm="corral-egress"`)
	}
	return reason.Status(), phraseOf(message), header, message + "\n"
}

// phraseOf makes the message a valid reason phrase: one line of visible characters.
func phraseOf(message string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, message)
}

// writeRefusal answers with the message as the status line's reason phrase (what curl
// shows for a refused CONNECT), the body and the X-Corral-Egress-Reason header, then closes
// the connection. net/http writes only the standard phrase, so the response is written on
// the hijacked connection.
func writeRefusal(w http.ResponseWriter, reason policy.Reason, message string) {
	code, phrase, header, body := refusalParts(reason, message)
	hj, ok := w.(http.Hijacker)
	if !ok {
		for k, v := range header {
			w.Header()[k] = v
		}
		w.WriteHeader(code)
		io.WriteString(w, body)
		return
	}
	conn, buf, err := hj.Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	header.Set("Content-Length", fmt.Sprint(len(body)))
	header.Set("Connection", "close")
	fmt.Fprintf(buf, "HTTP/1.1 %d %s\r\n", code, phrase)
	header.Write(buf)
	buf.WriteString("\r\n")
	buf.WriteString(body)
	if buf.Flush() != nil {
		return
	}
	lingerClose(conn, buf.Reader)
}

// lingerClose half-closes and reads what the client still sends (a request body) for a
// moment, so closing does not reset the connection before the client read the answer.
func lingerClose(conn net.Conn, r *bufio.Reader) {
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
	_ = conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	_, _ = io.Copy(io.Discard, io.LimitReader(r, 1<<20))
}

// plainWriter follows a plain request's answer: the outcome when the headers go out, the
// bytes of the body, and a refusal from the engine rewritten with Corral's reason phrase.
type plainWriter struct {
	http.ResponseWriter
	f       *flight
	refused bool
}

func (w *plainWriter) WriteHeader(code int) {
	w.f.mu.Lock()
	failure := w.f.failure
	w.f.mu.Unlock()
	if failure != nil {
		w.refused = true
		writeRefusal(w.ResponseWriter, failure.reason, failure.message)
		return
	}
	w.f.finish("allowed", policy.Allowed, "")
	w.ResponseWriter.WriteHeader(code)
}

func (w *plainWriter) Write(b []byte) (int, error) {
	if w.refused {
		return len(b), nil
	}
	n, err := w.ResponseWriter.Write(b)
	w.f.addDown(n)
	return n, err
}

type countedBody struct {
	io.ReadCloser
	f *flight
}

func (b *countedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.f.addUp(n)
	return n, err
}

// copyTunnel carries a CONNECT tunnel both ways and passes on a half-close: when one side
// has sent all it will (git closes its side once its request is out; protocol v2's
// upload-pack waits for exactly that), the other side reads EOF while the answer still flows
// back. The engine's own copy needs both ends to be bare TCP connections for that, and ours
// are wrapped (byte counts, idle tracking). An error on either way ends the tunnel.
func (g *Gateway) copyTunnel(_ *goproxy.ProxyCtx, client, target net.Conn) {
	var entry *records.Entry
	tunnel := tunnelOf(target)
	if tunnel != nil {
		entry = tunnel.e
	}
	up := func(n int) {
		if entry != nil {
			entry.AddUp(n)
		}
		if tunnel != nil {
			tunnel.touch()
		}
	}
	down := func(n int) {
		if entry != nil {
			entry.AddDown(n)
		}
		if tunnel != nil {
			tunnel.touch()
		}
	}
	var wg sync.WaitGroup
	wg.Add(2)
	pipe := func(dst, src net.Conn, count func(int)) {
		defer wg.Done()
		if err := g.carry(dst, src, count); err != nil {
			client.Close()
			target.Close()
			return
		}
		if closeWrite(dst) != nil {
			dst.Close()
		}
	}
	go pipe(target, client, up)
	go pipe(client, target, down)
	wg.Wait()
	client.Close()
	target.Close()
}

// carry copies src to dst until src's EOF (nil) or an error. Between two bare TCP
// connections it splices (no copy through user space: on a 2-core node the gateway's share
// of a bulk download's CPU halves), a chunk at a time, waking at least every activityStep
// to report what moved (Drain reads a tunnel's activity from it), so a tunnel that moves
// bytes lives on and one whose source is silent for the idle timeout ends; otherwise it
// copies through a pooled buffer. `count` hears what the splice moves.
func (g *Gateway) carry(dst, src net.Conn, count func(int)) error {
	rawDst, rawSrc := bareTCP(dst), bareTCP(src)
	if rawDst == nil || rawSrc == nil {
		buf := tunnelBuffers.Get().(*[]byte)
		defer tunnelBuffers.Put(buf)
		// Counted by the tunnel's own connection (tunnelConn), which this path goes through.
		_, err := io.CopyBuffer(dst, src, *buf)
		return err
	}
	idle := g.cfg.IdleTimeout
	if idle <= 0 {
		idle = 5 * time.Minute
	}
	step := min(idle, activityStep)
	if q := g.cfg.DrainQuiet / 4; q > 0 && q < step {
		step = max(q, 10*time.Millisecond)
	}
	var silent time.Duration
	for {
		now := time.Now()
		_ = rawSrc.SetReadDeadline(now.Add(step))
		_ = rawDst.SetWriteDeadline(now.Add(idle)) // a slow reader is not cut before that
		n, err := io.CopyN(rawDst, rawSrc, spliceChunk)
		if n > 0 {
			count(int(n))
			silent = 0
		}
		switch {
		case err == nil:
		case errors.Is(err, io.EOF):
			return nil
		case errors.Is(err, os.ErrDeadlineExceeded) && n > 0:
			// Bytes moved within the step: not idle, only slow.
		case errors.Is(err, os.ErrDeadlineExceeded):
			// Nothing moved (a silent source for a step, or a destination that took nothing
			// for the idle timeout): it ends once that time adds up to the idle timeout.
			if silent += time.Since(now); silent < idle {
				continue
			}
			return err
		default:
			return err
		}
	}
}

const spliceChunk = 1 << 20

// activityStep bounds how long a splice waits before it reports the bytes it moved (a var:
// the tests shorten it).
var activityStep = 5 * time.Second

// bareTCP is the TCP connection under the gateway's and the engine's wrappers, or nil.
func bareTCP(c net.Conn) *net.TCPConn {
	for c != nil {
		if v, ok := c.(*net.TCPConn); ok {
			return v
		}
		c = unwrap(c)
	}
	return nil
}

// tunnelOf is the gateway's own wrapper of an upstream connection (its byte counts), or nil.
func tunnelOf(c net.Conn) *tunnelConn {
	for c != nil {
		if v, ok := c.(*tunnelConn); ok {
			return v
		}
		c = unwrap(c)
	}
	return nil
}

// unwrap is the connection one wrapper down (the gateway's, the engine's), or nil.
func unwrap(c net.Conn) net.Conn {
	switch v := c.(type) {
	case *tunnelConn:
		return v.Conn
	case *conntrack.InstrumentedConn:
		return v.Conn
	case *smokescreen.TimeoutConn:
		return v.Conn
	default:
		return nil
	}
}

// tunnelBuffers: 128 KiB a direction (io.Copy's 32 KiB costs throughput in system calls).
var tunnelBuffers = sync.Pool{New: func() any { b := make([]byte, 128<<10); return &b }}

// closeWrite half-closes c, unwrapping the gateway's and the engine's wrappers down to the
// TCP connection; a connection that cannot half-close is closed.
func closeWrite(c net.Conn) error {
	for inner := c; inner != nil; inner = unwrap(inner) {
		if v, ok := inner.(interface{ CloseWrite() error }); ok {
			return v.CloseWrite()
		}
	}
	return c.Close()
}

// Drain lets the open tunnels finish once the listener takes no new ones (a rollout's
// SIGTERM), so a model's answer streaming through the gateway is not cut (the harness would
// send the request again, and the provider bill it twice). A tunnel that has carried nothing
// for `quiet` (a keep-alive connection whose request is answered) is closed at once, a busy
// one when it ends; whatever is still open when ctx ends is closed. It answers how many
// tunnels were closed that way, busy or not.
func (g *Gateway) Drain(ctx context.Context, quiet time.Duration) int {
	every := quiet / 4
	if every < 20*time.Millisecond {
		every = 20 * time.Millisecond
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		open := 0
		now := time.Now().UnixNano()
		g.tunnels.Range(func(k, _ any) bool {
			if t := k.(*tunnelConn); now-t.last.Load() >= int64(quiet) {
				t.Close()
			} else {
				open++
			}
			return true
		})
		if open == 0 {
			return 0
		}
		select {
		case <-ctx.Done():
			cut := 0
			g.tunnels.Range(func(k, _ any) bool {
				k.(*tunnelConn).Close()
				cut++
				return true
			})
			return cut
		case <-tick.C:
		}
	}
}

// tunnelConn is a CONNECT tunnel's upstream side: writes go up, reads come down.
type tunnelConn struct {
	net.Conn
	g      *Gateway
	e      *records.Entry
	closed atomic.Bool
	last   atomic.Int64 // when it last carried a byte either way (Unix ns), for Drain
}

func (c *tunnelConn) touch() { c.last.Store(time.Now().UnixNano()) }

func (c *tunnelConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.e.AddDown(n)
		c.touch()
	}
	return n, err
}

func (c *tunnelConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if n > 0 {
		c.e.AddUp(n)
		c.touch()
	}
	return n, err
}

func (c *tunnelConn) Close() error {
	if !c.closed.Swap(true) {
		c.g.open.Add(-1)
		c.g.tunnels.Delete(c)
	}
	return c.Conn.Close()
}

type pooledConn struct {
	net.Conn
	g      *Gateway
	closed atomic.Bool
}

func (c *pooledConn) Close() error {
	if !c.closed.Swap(true) {
		c.g.open.Add(-1)
	}
	return c.Conn.Close()
}

// decisionLine is the decision log's line (never a credential: no header is logged).
type decisionLine struct {
	Time      string `json:"time"`
	Msg       string `json:"msg"`
	Source    string `json:"source"`
	UID       string `json:"uid,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	Session   string `json:"session,omitempty"`
	Agent     string `json:"agent,omitempty"`
	Identity  string `json:"identity,omitempty"`
	Method    string `json:"method"`
	Host      string `json:"host"`
	Port      uint16 `json:"port,omitempty"`
	Address   string `json:"address,omitempty"`
	Decision  string `json:"decision"`
	Reason    string `json:"reason,omitempty"`
	Message   string `json:"message,omitempty"`
}

func (g *Gateway) logDecision(f *flight, decision string, reason policy.Reason, message string) {
	line := decisionLine{
		Time: time.Now().UTC().Format(time.RFC3339Nano), Msg: "egress decision", Source: f.source.String(),
		Namespace: f.who.Namespace, Session: f.who.Session, Agent: f.who.Agent, Identity: f.who.Identity,
		Method: f.method, Host: f.req.Host.String(), Port: f.req.Port, Decision: decision,
		Reason: string(reason), Message: message,
	}
	if f.binding != nil {
		line.UID = f.binding.UID
	}
	if line.Host == "" {
		line.Host = f.rawHost
	}
	if f.verdict.Allowed() && f.verdict.Dial.IsValid() {
		line.Address = f.verdict.Dial.String()
	}
	data, err := json.Marshal(line)
	if err != nil {
		return
	}
	g.logMu.Lock()
	defer g.logMu.Unlock()
	g.cfg.DecisionLog.Write(append(data, '\n'))
}
