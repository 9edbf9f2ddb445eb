// corral-gateway is Corral's egress gateway (docs/egress.md, ADR 0102): every sandbox and
// Evidence pod leaves through it, and it allows each pod's two identities (the custodian, by
// its proxy credential, and the agent) exactly their binding's rules.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"corral.dev/gateway/internal/admin"
	"corral.dev/gateway/internal/bindings"
	"corral.dev/gateway/internal/policy"
	"corral.dev/gateway/internal/proxy"
	"corral.dev/gateway/internal/records"
	"corral.dev/gateway/internal/resolve"
)

const serviceAccount = "/var/run/secrets/kubernetes.io/serviceaccount/"

type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, ",") }
func (r *repeated) Set(v string) error { *r = append(*r, v); return nil }

type options struct {
	listen, admin               string
	kubeAPI, kubeToken, kubeCA  string
	namespaces                  repeated
	bindingsFile, hostsFile     string
	bindingKeyFile              string
	bindingKey                  []byte
	platformRules, deny, allow  repeated
	connectTimeout, idleTimeout time.Duration
	drainTimeout, drainQuiet    time.Duration
}

func parseFlags(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("corral-gateway", flag.ContinueOnError)
	fs.StringVar(&o.listen, "listen", ":3128", "proxy address (CONNECT and plain http)")
	fs.StringVar(&o.admin, "admin", ":9091", "admin address: /readyz, /v1/egress, /v1/bindings, /metrics")
	fs.StringVar(&o.kubeAPI, "kube-api", "", "the API server's URL (default: in-cluster)")
	fs.StringVar(&o.kubeToken, "kube-token-file", serviceAccount+"token", "bearer token file")
	fs.StringVar(&o.kubeCA, "kube-ca-file", serviceAccount+"ca.crt", "the API server's CA")
	fs.Var(&o.namespaces, "namespace", "watch pods of this namespace (repeatable; default all)")
	fs.StringVar(&o.bindingsFile, "bindings-file", "", "read bindings from this JSON file instead of the API (tests)")
	fs.StringVar(&o.bindingKeyFile, "binding-key-file", "", "the key the operator signs bindings with: unsigned bindings are unknown")
	fs.StringVar(&o.hostsFile, "hosts-file", "", "names -> addresses (/etc/hosts format), consulted before DNS")
	fs.Var(&o.platformRules, "platform-rule", "a rule (JSON) every custodian may use (repeatable)")
	fs.Var(&o.deny, "deny-cidr", "a range refused besides the defaults (repeatable)")
	fs.Var(&o.allow, "allow-range", "a range treated as public although refused (repeatable)")
	fs.DurationVar(&o.connectTimeout, "connect-timeout", 10*time.Second, "upstream connect timeout")
	fs.DurationVar(&o.idleTimeout, "idle-timeout", 5*time.Minute, "close a connection idle this long")
	fs.DurationVar(&o.drainTimeout, "drain-timeout", 90*time.Second, "on SIGTERM, how long open tunnels may go on before they are closed")
	fs.DurationVar(&o.drainQuiet, "drain-quiet", 30*time.Second, "on SIGTERM, close a tunnel that has carried nothing this long")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if o.bindingKeyFile != "" {
		raw, err := os.ReadFile(o.bindingKeyFile)
		if err != nil {
			return nil, fmt.Errorf("--binding-key-file: %w", err)
		}
		if o.bindingKey = []byte(strings.TrimSpace(string(raw))); len(o.bindingKey) < 32 {
			return nil, errors.New("--binding-key-file: the key is under 32 characters")
		}
	}
	if o.bindingsFile == "" && o.kubeAPI == "" {
		host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
		if host == "" || port == "" {
			return nil, errors.New("no bindings source: --bindings-file, --kube-api, or run in a cluster")
		}
		o.kubeAPI = "https://" + net.JoinHostPort(host, port)
	}
	return o, nil
}

func prefixes(raw []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(raw))
	for _, r := range raw {
		p, err := netip.ParsePrefix(r)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

func main() {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if err := run(os.Args[1:], log); err != nil {
		log.Error("corral-gateway failed", "error", err.Error())
		os.Exit(1)
	}
}

func run(args []string, log *slog.Logger) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	// The engine's upstream dialling reads HTTP(S)_PROXY from the environment on every
	// CONNECT; a gateway never chains to another proxy.
	for _, v := range []string{"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"} {
		os.Unsetenv(v)
	}
	var platform []policy.Rule
	for _, raw := range o.platformRules {
		r, err := policy.ParseRule([]byte(raw))
		if err != nil {
			return fmt.Errorf("--platform-rule %s: %w", raw, err)
		}
		platform = append(platform, r)
	}
	deny, err := prefixes(o.deny)
	if err != nil {
		return fmt.Errorf("--deny-cidr: %w", err)
	}
	allow, err := prefixes(o.allow)
	if err != nil {
		return fmt.Errorf("--allow-range: %w", err)
	}
	listenPort, err := portOf(o.listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	store := bindings.NewStore()
	recs := records.NewStore(nil)
	store.OnChange(recs.SetLive)
	ready := startSources(ctx, o, store, log)

	gw, err := proxy.New(proxy.Config{
		Bindings: store, Records: recs, Platform: platform,
		Ranges:         policy.NewRanges(deny, allow),
		Resolver:       &resolve.Resolver{HostsFile: o.hostsFile},
		ConnectTimeout: o.connectTimeout, IdleTimeout: o.idleTimeout, ListenPort: listenPort,
		DrainQuiet:  o.drainQuiet,
		DecisionLog: os.Stdout, Log: log,
	})
	if err != nil {
		return err
	}
	// Once draining, /readyz says so: no Service sends it a new connection.
	var draining atomic.Bool
	adminSrv := &admin.Server{
		Bindings: store, Records: recs, Ready: func() bool { return !draining.Load() && ready() },
		Gauges: func() records.Gauges {
			return records.Gauges{Bindings: store.Count(), Connections: gw.OpenConnections(), WatchRestart: bindings.Restarts.Load()}
		},
	}

	proxyLn, err := net.Listen("tcp", o.listen)
	if err != nil {
		return err
	}
	adminLn, err := net.Listen("tcp", o.admin)
	if err != nil {
		return err
	}
	proxyServer := &http.Server{Handler: gw, ReadHeaderTimeout: 30 * time.Second, IdleTimeout: o.idleTimeout}
	adminServer := &http.Server{Handler: adminSrv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	errs := make(chan error, 2)
	go func() { errs <- proxyServer.Serve(proxyLn) }()
	go func() { errs <- adminServer.Serve(adminLn) }()
	go func() {
		for tick := time.NewTicker(time.Minute); ; {
			select {
			case <-ctx.Done():
				tick.Stop()
				return
			case <-tick.C:
				recs.Expire()
			}
		}
	}()
	log.Info("corral-gateway serving", "listen", proxyLn.Addr().String(), "admin", adminLn.Addr().String())

	select {
	case <-ctx.Done():
	case err := <-errs:
		return err
	}
	// A rollout or a drain: take no new connection, let the ones open finish (Drain).
	draining.Store(true)
	drain, cancel := context.WithTimeout(context.Background(), o.drainTimeout)
	defer cancel()
	closed := make(chan struct{})
	go func() { _ = proxyServer.Shutdown(drain); close(closed) }()
	start := time.Now()
	cut := gw.Drain(drain, o.drainQuiet)
	<-closed
	log.Info("corral-gateway drained", "seconds", time.Since(start).Seconds(), "tunnelsCutAtTheEnd", cut)
	shutdown, cancelAdmin := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancelAdmin()
	_ = adminServer.Shutdown(shutdown)
	return nil
}

// startSources starts the bindings file or the pod watches and answers whether every one
// has synced once.
func startSources(ctx context.Context, o *options, store *bindings.Store, log *slog.Logger) func() bool {
	var waits []chan struct{}
	if o.bindingsFile != "" {
		ready := make(chan struct{})
		waits = append(waits, ready)
		go bindings.WatchFile(ctx, o.bindingsFile, store, log, ready)
	} else {
		kube := &bindings.KubeSource{Server: o.kubeAPI, TokenFile: o.kubeToken, CAFile: o.kubeCA, Key: o.bindingKey}
		namespaces := []string(o.namespaces)
		if len(namespaces) == 0 {
			namespaces = []string{""}
		}
		for _, ns := range namespaces {
			ready := make(chan struct{})
			waits = append(waits, ready)
			go kube.Watch(ctx, ns, store, log, ready)
		}
	}
	return func() bool {
		for _, w := range waits {
			select {
			case <-w:
			default:
				return false
			}
		}
		return true
	}
}

func portOf(addr string) (uint16, error) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(port, 10, 16)
	return uint16(n), err
}
