package records

import (
	"fmt"
	"io"
	"sort"
	"strings"
)

// Gauges the metrics page reads at the time of the scrape.
type Gauges struct {
	Bindings     int
	Connections  int64
	WatchRestart uint64
}

// WriteMetrics writes the Prometheus text exposition.
func (s *Store) WriteMetrics(w io.Writer, g Gauges) {
	s.mu.Lock()
	reqs := make([]string, 0, len(s.requests))
	for l, n := range s.requests {
		reqs = append(reqs, fmt.Sprintf("corral_gateway_requests_total{namespace=%s,agent=%s,host=%s,decision=%s,identity=%s} %d\n",
			quote(l.namespace), quote(l.agent), quote(l.host), quote(l.decision), quote(l.identity), n))
	}
	bytes := make([]string, 0, 2*len(s.bytes))
	for k, c := range s.bytes {
		for i, dir := range []string{"up", "down"} {
			bytes = append(bytes, fmt.Sprintf("corral_gateway_bytes_total{namespace=%s,agent=%s,direction=%q} %d\n",
				quote(k[0]), quote(k[1]), dir, c[i].Load()))
		}
	}
	s.mu.Unlock()
	sort.Strings(reqs)
	sort.Strings(bytes)
	fmt.Fprint(w, "# HELP corral_gateway_requests_total Egress decisions by namespace, agent, host, decision and identity.\n")
	fmt.Fprint(w, "# TYPE corral_gateway_requests_total counter\n", strings.Join(reqs, ""))
	fmt.Fprint(w, "# HELP corral_gateway_bytes_total Bytes through the gateway, up (to the destination) and down.\n")
	fmt.Fprint(w, "# TYPE corral_gateway_bytes_total counter\n", strings.Join(bytes, ""))
	fmt.Fprintf(w, "# HELP corral_gateway_bindings Source addresses with a binding in force.\n# TYPE corral_gateway_bindings gauge\ncorral_gateway_bindings %d\n", g.Bindings)
	fmt.Fprintf(w, "# HELP corral_gateway_connections Open upstream connections (tunnels and plain http).\n# TYPE corral_gateway_connections gauge\ncorral_gateway_connections %d\n", g.Connections)
	fmt.Fprintf(w, "# HELP corral_gateway_watch_restarts_total Restarts of the pod watch.\n# TYPE corral_gateway_watch_restarts_total counter\ncorral_gateway_watch_restarts_total %d\n", g.WatchRestart)
}

// quote escapes a label value as the text format wants: backslash, quote and newline.
func quote(v string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	return `"` + r.Replace(v) + `"`
}
