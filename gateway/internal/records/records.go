// Package records keeps what each Session's sandbox reached and was refused (the Session's
// loop reads them from the admin port and writes them into its status; the gateway itself
// writes nothing to the API) and the Prometheus counters.
package records

import (
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// MaxHosts per session; later (identity, host:port, decision) keys count in "other".
	MaxHosts = 200
	// Retention of a session's records after its last pod went: the Session's loop may read
	// them late.
	Retention = time.Hour
	// MaxDeniedHostLabels per namespace in the metrics; later denied hosts are "other".
	MaxDeniedHostLabels = 100
	OtherHost           = "other"
)

// SessionKey names a binding's records: Evidence bindings have session "".
type SessionKey struct{ Namespace, Session string }

// EntryKey is one row of a session's records.
type EntryKey struct {
	Identity string // agent | custodian
	Host     string
	Port     uint16
	Decision string // allowed | denied
}

// Entry is one row: counts and bytes move under the entry's own atomics, so a tunnel's
// copy loop never takes the store's lock.
type Entry struct {
	Key       EntryKey
	count     atomic.Uint64
	bytesUp   atomic.Uint64
	bytesDown atomic.Uint64
	mu        sync.Mutex
	first     time.Time
	last      time.Time
	reason    string
	up, down  *atomic.Uint64 // the namespace/agent byte counters of the metrics
}

// AddUp and AddDown count bytes sent upstream and received.
func (e *Entry) AddUp(n int) {
	e.bytesUp.Add(uint64(n))
	e.up.Add(uint64(n))
}

func (e *Entry) AddDown(n int) {
	e.bytesDown.Add(uint64(n))
	e.down.Add(uint64(n))
}

type session struct {
	key       SessionKey
	agent     string
	entries   map[EntryKey]*Entry
	truncated uint64
	goneAt    time.Time // zero while a pod of the session is bound
}

type labels struct{ namespace, agent, host, decision, identity string }

// Store holds every session's records and the metrics' counters.
type Store struct {
	mu       sync.Mutex
	now      func() time.Time
	sessions map[SessionKey]*session
	requests map[labels]uint64
	bytes    map[[2]string]*[2]atomic.Uint64 // (namespace, agent) -> up, down
	denied   map[string]map[string]bool      // namespace -> denied hosts with their own label
}

func NewStore(now func() time.Time) *Store {
	if now == nil {
		now = time.Now
	}
	return &Store{
		now:      now,
		sessions: map[SessionKey]*session{},
		requests: map[labels]uint64{},
		bytes:    map[[2]string]*[2]atomic.Uint64{},
		denied:   map[string]map[string]bool{},
	}
}

// Who made a request: its binding (nil for an unknown source) and identity.
type Who struct {
	Known     bool
	Namespace string
	Session   string
	Agent     string
	Identity  string
}

// Hit counts one decision and answers the row it went to (bytes are added there).
func (s *Store) Hit(who Who, host string, port uint16, decision, reason string) *Entry {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.countMetric(who, host, decision)
	byteCounters := s.byteCounters(who.Namespace, who.Agent)
	if !who.Known {
		return &Entry{up: &byteCounters[0], down: &byteCounters[1]}
	}
	key := SessionKey{who.Namespace, who.Session}
	sess := s.sessions[key]
	if sess == nil {
		sess = &session{key: key, entries: map[EntryKey]*Entry{}}
		s.sessions[key] = sess
	}
	sess.agent = who.Agent
	ek := EntryKey{Identity: who.Identity, Host: host, Port: port, Decision: decision}
	e := sess.entries[ek]
	if e == nil {
		if len(sess.entries) >= MaxHosts {
			ek = EntryKey{Identity: who.Identity, Host: OtherHost, Decision: decision}
			sess.truncated++
			e = sess.entries[ek]
		}
		if e == nil {
			e = &Entry{Key: ek, first: now, up: &byteCounters[0], down: &byteCounters[1]}
			sess.entries[ek] = e
		}
	} else if e.Key.Host == OtherHost {
		sess.truncated++
	}
	e.count.Add(1)
	e.mu.Lock()
	e.last, e.reason = now, reason
	e.mu.Unlock()
	return e
}

func (s *Store) countMetric(who Who, host, decision string) {
	if decision != "allowed" {
		seen := s.denied[who.Namespace]
		if seen == nil {
			seen = map[string]bool{}
			s.denied[who.Namespace] = seen
		}
		if !seen[host] {
			if len(seen) >= MaxDeniedHostLabels {
				host = OtherHost
			} else {
				seen[host] = true
			}
		}
	}
	s.requests[labels{who.Namespace, who.Agent, host, decision, who.Identity}]++
}

func (s *Store) byteCounters(namespace, agent string) *[2]atomic.Uint64 {
	k := [2]string{namespace, agent}
	c := s.bytes[k]
	if c == nil {
		c = &[2]atomic.Uint64{}
		s.bytes[k] = c
	}
	return c
}

// SetLive marks which sessions have a bound pod; a session without one is kept for
// Retention, then dropped.
func (s *Store) SetLive(live map[[2]string]bool) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for key, sess := range s.sessions {
		if live[[2]string{key.Namespace, key.Session}] {
			sess.goneAt = time.Time{}
		} else if sess.goneAt.IsZero() {
			sess.goneAt = now
		}
	}
	s.expireLocked(now)
}

// Expire drops sessions gone for longer than Retention (called periodically and on reads).
func (s *Store) Expire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked(s.now())
}

func (s *Store) expireLocked(now time.Time) {
	for key, sess := range s.sessions {
		if !sess.goneAt.IsZero() && now.Sub(sess.goneAt) > Retention {
			delete(s.sessions, key)
		}
	}
}

// Row is one entry as the admin API answers it.
type Row struct {
	Host      string `json:"host"`
	Port      uint16 `json:"port"`
	Identity  string `json:"identity"`
	Decision  string `json:"decision"`
	Reason    string `json:"reason"`
	Count     uint64 `json:"count"`
	BytesUp   uint64 `json:"bytesUp"`
	BytesDown uint64 `json:"bytesDown"`
	FirstSeen string `json:"firstSeen"`
	LastSeen  string `json:"lastSeen"`
}

// Report is a session's records.
type Report struct {
	Namespace string `json:"namespace"`
	Session   string `json:"session"`
	Agent     string `json:"agent"`
	Hosts     []Row  `json:"hosts"`
	Truncated uint64 `json:"truncated"`
}

// Summary is a session's line in the list of every session.
type Summary struct {
	Namespace string `json:"namespace"`
	Session   string `json:"session"`
	Agent     string `json:"agent"`
	Hosts     int    `json:"hosts"`
	Allowed   uint64 `json:"allowed"`
	Denied    uint64 `json:"denied"`
	BytesUp   uint64 `json:"bytesUp"`
	BytesDown uint64 `json:"bytesDown"`
	Truncated uint64 `json:"truncated"`
	Bound     bool   `json:"bound"`
	GoneAt    string `json:"goneAt,omitempty"`
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// Session answers one session's records; ok false when unknown.
func (s *Store) Session(key SessionKey) (Report, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked(s.now())
	return s.reportLocked(key)
}

// Reports answers every session's records (of one namespace when namespace is not ""): what
// the operator's poll reads, in one request per replica however many Sessions there are.
func (s *Store) Reports(namespace string) []Report {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked(s.now())
	out := []Report{}
	for _, key := range s.keysLocked(namespace) {
		if rep, ok := s.reportLocked(key); ok {
			out = append(out, rep)
		}
	}
	return out
}

// keysLocked: the sessions (of one namespace when namespace is not ""), in order.
func (s *Store) keysLocked(namespace string) []SessionKey {
	keys := make([]SessionKey, 0, len(s.sessions))
	for key := range s.sessions {
		if namespace == "" || key.Namespace == namespace {
			keys = append(keys, key)
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].Namespace != keys[j].Namespace {
			return keys[i].Namespace < keys[j].Namespace
		}
		return keys[i].Session < keys[j].Session
	})
	return keys
}

func (s *Store) reportLocked(key SessionKey) (Report, bool) {
	sess := s.sessions[key]
	if sess == nil {
		return Report{}, false
	}
	rep := Report{Namespace: key.Namespace, Session: key.Session, Agent: sess.agent, Hosts: []Row{}, Truncated: sess.truncated}
	for _, e := range sess.entries {
		e.mu.Lock()
		rep.Hosts = append(rep.Hosts, Row{
			Host: e.Key.Host, Port: e.Key.Port, Identity: e.Key.Identity, Decision: e.Key.Decision,
			Reason: e.reason, Count: e.count.Load(), BytesUp: e.bytesUp.Load(), BytesDown: e.bytesDown.Load(),
			FirstSeen: stamp(e.first), LastSeen: stamp(e.last),
		})
		e.mu.Unlock()
	}
	sort.Slice(rep.Hosts, func(i, j int) bool {
		a, b := rep.Hosts[i], rep.Hosts[j]
		if a.Host != b.Host {
			return a.Host < b.Host
		}
		if a.Port != b.Port {
			return a.Port < b.Port
		}
		if a.Identity != b.Identity {
			return a.Identity < b.Identity
		}
		return a.Decision < b.Decision
	})
	return rep, true
}

// Sessions answers every session's summary (of one namespace when namespace is not "").
func (s *Store) Sessions(namespace string) []Summary {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked(s.now())
	out := []Summary{}
	for _, key := range s.keysLocked(namespace) {
		sess := s.sessions[key]
		sum := Summary{Namespace: key.Namespace, Session: key.Session, Agent: sess.agent,
			Hosts: len(sess.entries), Truncated: sess.truncated, Bound: sess.goneAt.IsZero()}
		if !sess.goneAt.IsZero() {
			sum.GoneAt = stamp(sess.goneAt)
		}
		for _, e := range sess.entries {
			if e.Key.Decision == "allowed" {
				sum.Allowed += e.count.Load()
			} else {
				sum.Denied += e.count.Load()
			}
			sum.BytesUp += e.bytesUp.Load()
			sum.BytesDown += e.bytesDown.Load()
		}
		out = append(out, sum)
	}
	return out
}
