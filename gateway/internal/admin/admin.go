// Package admin is the gateway's admin port: readiness, the records a Session's loop reads,
// the binding in force for an address, and the metrics. The sandboxes' NetworkPolicy allows
// only the proxy port, so no sandbox reaches this.
package admin

import (
	"encoding/json"
	"net/http"
	"net/netip"

	"corral.dev/gateway/internal/bindings"
	"corral.dev/gateway/internal/records"
)

// Server holds what the admin port reads.
type Server struct {
	Bindings *bindings.Store
	Records  *records.Store
	Ready    func() bool
	Gauges   func() records.Gauges
}

// Handler routes the admin endpoints.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !s.Ready() {
			http.Error(w, "bindings not synced yet", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /v1/egress", s.egress)
	mux.HandleFunc("GET /v1/bindings", s.binding)
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		s.Records.WriteMetrics(w, s.Gauges())
	})
	return mux
}

// egress: one session's records (`namespace` and `session`, which may be "" for an
// Evidence's), or every session's summary without `session` (with `detail=hosts`, every
// session's records: the operator's poll).
func (s *Server) egress(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if _, one := q["session"]; !one {
		if q.Get("detail") == "hosts" {
			writeJSON(w, map[string]any{"sessions": s.Records.Reports(q.Get("namespace"))})
			return
		}
		writeJSON(w, map[string]any{"sessions": s.Records.Sessions(q.Get("namespace"))})
		return
	}
	if q.Get("namespace") == "" {
		http.Error(w, "namespace is required with session", http.StatusBadRequest)
		return
	}
	rep, ok := s.Records.Session(records.SessionKey{Namespace: q.Get("namespace"), Session: q.Get("session")})
	if !ok {
		http.Error(w, "no records for this session", http.StatusNotFound)
		return
	}
	writeJSON(w, rep)
}

func (s *Server) binding(w http.ResponseWriter, r *http.Request) {
	addr, err := netip.ParseAddr(r.URL.Query().Get("ip"))
	if err != nil {
		http.Error(w, "ip is required", http.StatusBadRequest)
		return
	}
	b := s.Bindings.Lookup(addr)
	if b == nil {
		http.Error(w, "no binding for this address", http.StatusNotFound)
		return
	}
	writeJSON(w, map[string]any{
		"uid": b.UID, "namespace": b.Namespace, "session": b.Session, "agent": b.Agent, "custodian": b.HasCustodian(),
		"digest": b.Digest,
	})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}
