package bindings

import (
	"net/netip"
	"sync"
	"time"
)

// Claim is a pod's hold on its addresses while it is Running with an address.
type Claim struct {
	UID     string
	Addrs   []netip.Addr
	Created time.Time
	Binding *Binding // nil: the pod's annotation did not parse (the pod is unknown)
}

// Store is the address -> binding map. Claims are kept by pod UID and the address map is
// recomputed from them on every change, so a pod that reuses an address gets its own binding
// the moment it is claimed, and an old pod's late event can drop only its own mapping. Two
// Running pods claiming one address (the old pod's status not yet updated) resolve to the
// newer pod: the address's traffic is the new sandbox's.
type Store struct {
	mu      sync.RWMutex
	claims  map[string]map[string]Claim // scope (a watched namespace, "" for all, or the file) -> UID -> claim
	byAddr  map[netip.Addr]Claim
	onLive  func(live map[[2]string]bool)
	version uint64
}

func NewStore() *Store {
	return &Store{claims: map[string]map[string]Claim{}, byAddr: map[netip.Addr]Claim{}}
}

// OnChange registers a callback with the set of (namespace, session) pairs that have a live
// binding, called after every change (the records keep a gone session's records a while).
func (s *Store) OnChange(f func(live map[[2]string]bool)) { s.onLive = f }

// Lookup: the binding for a source address; nil when unknown.
func (s *Store) Lookup(addr netip.Addr) *Binding {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.byAddr[addr.Unmap()].Binding
}

// Count of addresses with a binding.
func (s *Store) Count() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	n := 0
	for _, c := range s.byAddr {
		if c.Binding != nil {
			n++
		}
	}
	return n
}

// Put records (or replaces) one pod's claim.
func (s *Store) Put(scope string, c Claim) {
	s.mu.Lock()
	if s.claims[scope] == nil {
		s.claims[scope] = map[string]Claim{}
	}
	s.claims[scope][c.UID] = c
	s.rebuildLocked()
	s.mu.Unlock()
	s.notify()
}

// Drop removes a pod's claim (deleted, or no longer Running); other pods' claims stay.
func (s *Store) Drop(scope, uid string) {
	s.mu.Lock()
	if _, ok := s.claims[scope][uid]; !ok {
		s.mu.Unlock()
		return
	}
	delete(s.claims[scope], uid)
	s.rebuildLocked()
	s.mu.Unlock()
	s.notify()
}

// Replace sets a scope's claims to exactly these (a fresh list, or a re-read file).
func (s *Store) Replace(scope string, claims []Claim) {
	m := make(map[string]Claim, len(claims))
	for _, c := range claims {
		m[c.UID] = c
	}
	s.mu.Lock()
	s.claims[scope] = m
	s.rebuildLocked()
	s.mu.Unlock()
	s.notify()
}

func (s *Store) rebuildLocked() {
	byAddr := make(map[netip.Addr]Claim, len(s.byAddr))
	for _, scope := range s.claims {
		for _, c := range scope {
			for _, a := range c.Addrs {
				a = a.Unmap()
				old, taken := byAddr[a]
				if !taken || newer(c, old) {
					byAddr[a] = c
				}
			}
		}
	}
	s.byAddr = byAddr
	s.version++
}

// newer orders two claims on one address: the later-created pod wins, UID breaks ties so the
// choice does not depend on map order.
func newer(a, b Claim) bool {
	if !a.Created.Equal(b.Created) {
		return a.Created.After(b.Created)
	}
	return a.UID > b.UID
}

func (s *Store) notify() {
	if s.onLive == nil {
		return
	}
	live := map[[2]string]bool{}
	s.mu.RLock()
	for _, c := range s.byAddr {
		if c.Binding != nil {
			live[[2]string{c.Binding.Namespace, c.Binding.Session}] = true
		}
	}
	s.mu.RUnlock()
	s.onLive(live)
}
