package bindings

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func annotationFor(session string, rules string) string {
	return fmt.Sprintf(`{"v":1,"namespace":"ns","session":%q,"agent":"coder","credentialSha256":"","agentRules":%s,"custodianRules":[],"checkoutRules":[]}`, session, rules)
}

func TestParse(t *testing.T) {
	b, err := Parse("u1", []byte(annotationFor("s1", `[{"host":"pypi.org","ports":[]}]`)))
	if err != nil || b.Session != "s1" || len(b.AgentRules) != 1 || b.HasCustodian() {
		t.Fatalf("%+v %v", b, err)
	}
	if sum := sha256.Sum256([]byte(annotationFor("s1", `[{"host":"pypi.org","ports":[]}]`))); b.Digest != hex.EncodeToString(sum[:]) {
		t.Fatalf("digest %q is not the annotation's SHA-256", b.Digest)
	}
	for _, bad := range []string{
		`{}`, `not json`, strings.Replace(annotationFor("s", "[]"), `"v":1`, `"v":2`, 1),
		annotationFor("s", `[{"host":"a b"}]`),
		strings.Replace(annotationFor("s", "[]"), `"credentialSha256":""`, `"credentialSha256":"abc"`, 1),
	} {
		if _, err := Parse("u", []byte(bad)); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
}

func mustBinding(t *testing.T, uid, session string) *Binding {
	t.Helper()
	b, err := Parse(uid, []byte(annotationFor(session, "[]")))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestStoreReplacesByUID(t *testing.T) {
	s := NewStore()
	ip := netip.MustParseAddr("198.18.0.7")
	t0 := time.Unix(1000, 0)
	s.Put("ns/", Claim{UID: "old", Addrs: []netip.Addr{ip}, Created: t0, Binding: mustBinding(t, "old", "s-old")})
	if b := s.Lookup(ip); b == nil || b.UID != "old" {
		t.Fatalf("old pod bound: %+v", b)
	}
	// A new pod on the reused address (the old pod's status not yet updated): the new one.
	s.Put("ns/", Claim{UID: "new", Addrs: []netip.Addr{ip}, Created: t0.Add(time.Minute), Binding: mustBinding(t, "new", "s-new")})
	if b := s.Lookup(ip); b == nil || b.UID != "new" || b.Session != "s-new" {
		t.Fatalf("new pod: %+v", b)
	}
	// The old pod's late update or deletion never takes the address back or drops the new.
	s.Put("ns/", Claim{UID: "old", Addrs: []netip.Addr{ip}, Created: t0, Binding: mustBinding(t, "old", "s-old")})
	if s.Lookup(ip).UID != "new" {
		t.Fatal("old pod's late update took the address")
	}
	s.Drop("ns/", "old")
	if b := s.Lookup(ip); b == nil || b.UID != "new" {
		t.Fatal("old pod's deletion dropped the new binding")
	}
	// A new pod whose binding does not parse holds the address as unknown: never the old one's.
	s.Put("ns/", Claim{UID: "broken", Addrs: []netip.Addr{ip}, Created: t0.Add(time.Hour)})
	if b := s.Lookup(ip); b != nil {
		t.Fatalf("an unparsable pod inherited %+v", b)
	}
	s.Drop("ns/", "broken")
	s.Drop("ns/", "new")
	if s.Lookup(ip) != nil || s.Count() != 0 {
		t.Fatal("bindings left after every pod went")
	}
}

func TestStoreReportsLiveSessions(t *testing.T) {
	s := NewStore()
	var live map[[2]string]bool
	s.OnChange(func(l map[[2]string]bool) { live = l })
	s.Replace("file", []Claim{{UID: "a", Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.10")}, Binding: mustBinding(t, "a", "s1")}})
	if !live[[2]string{"ns", "s1"}] {
		t.Fatalf("%v", live)
	}
	s.Replace("file", nil)
	if len(live) != 0 {
		t.Fatalf("%v", live)
	}
}

func TestWatchFileRereadsOnChange(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bindings.json")
	write := func(session string) {
		entries := []map[string]any{{"ip": "127.0.0.10", "uid": "u-" + session, "binding": json.RawMessage(annotationFor(session, "[]"))}}
		data, _ := json.Marshal(entries)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("first")
	s := NewStore()
	ready := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go WatchFile(ctx, path, s, quiet, ready)
	<-ready
	ip := netip.MustParseAddr("127.0.0.10")
	if s.Lookup(ip).Session != "first" {
		t.Fatal("first read")
	}
	time.Sleep(20 * time.Millisecond)
	write("second-session")
	deadline := time.Now().Add(3 * time.Second)
	for s.Lookup(ip) == nil || s.Lookup(ip).Session != "second-session" {
		if time.Now().After(deadline) {
			t.Fatal("the rewritten file was not read")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// fakeAPI serves a pod list and scripted watch streams, as the API server does.
type fakeAPI struct {
	mu      sync.Mutex
	list    []map[string]any
	relist  []map[string]any // what lists after the first answer, when set
	rv      string
	streams [][]string // each watch request takes the next stream of event lines
	lists   int
	tokens  []string
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.tokens = append(f.tokens, r.Header.Get("Authorization"))
	if r.URL.Query().Get("labelSelector") != LabelSelector {
		f.mu.Unlock()
		http.Error(w, "selector", 400)
		return
	}
	if r.URL.Query().Get("watch") == "" {
		items := f.list
		if f.lists > 0 && f.relist != nil {
			items = f.relist
		}
		f.lists++
		body, _ := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": f.rv}, "items": items})
		f.mu.Unlock()
		w.Write(body)
		return
	}
	if len(f.streams) == 0 {
		f.mu.Unlock()
		<-r.Context().Done()
		return
	}
	stream := f.streams[0]
	f.streams = f.streams[1:]
	f.mu.Unlock()
	for _, line := range stream {
		io.WriteString(w, line+"\n")
		w.(http.Flusher).Flush()
	}
}

func podJSON(uid, ip, phase string, created time.Time, annotation string, labelled bool) map[string]any {
	labels := map[string]any{}
	if labelled {
		labels[Label] = LabelValue
	}
	return map[string]any{
		"metadata": map[string]any{"uid": uid, "name": "p-" + uid, "namespace": "ns", "resourceVersion": "5",
			"creationTimestamp": created.UTC().Format(time.RFC3339), "labels": labels,
			"annotations": map[string]any{Annotation: annotation}},
		"status": map[string]any{"phase": phase, "podIP": ip},
	}
}

func event(kind string, obj map[string]any) string {
	data, _ := json.Marshal(map[string]any{"type": kind, "object": obj})
	return string(data)
}

func TestKubeWatchListsWatchesAndRelistsOnGone(t *testing.T) {
	t0 := time.Unix(2000, 0)
	ip := "198.18.0.9"
	api := &fakeAPI{rv: "10", list: []map[string]any{podJSON("a", ip, "Running", t0, annotationFor("s-a", "[]"), true)},
		relist: []map[string]any{podJSON("c", ip, "Running", t0.Add(time.Hour), annotationFor("s-c", "[]"), true)}}
	api.streams = [][]string{
		{
			event("MODIFIED", podJSON("a", ip, "Succeeded", t0, annotationFor("s-a", "[]"), true)),
			event("ADDED", podJSON("b", ip, "Running", t0.Add(time.Minute), annotationFor("s-b", "[]"), true)),
			event("ERROR", map[string]any{"kind": "Status", "code": 410, "message": "too old"}),
		},
	}
	srv := httptest.NewServer(api)
	defer srv.Close()
	token := filepath.Join(t.TempDir(), "token")
	os.WriteFile(token, []byte("tok-1\n"), 0o600)
	k := &KubeSource{Server: srv.URL, TokenFile: token}
	s := NewStore()
	ready := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	before := Restarts.Load()
	go k.Watch(ctx, "ns", s, quiet, ready)
	<-ready
	addr := netip.MustParseAddr(ip)
	waitFor(t, func() bool { api.mu.Lock(); defer api.mu.Unlock(); return api.lists >= 2 })
	// After the 410 the fresh list is the truth: pod c only, pods a and b are gone.
	waitFor(t, func() bool { b := s.Lookup(addr); return b != nil && b.UID == "c" })
	if s.Count() != 1 {
		t.Fatalf("bindings after the relist: %d", s.Count())
	}
	if Restarts.Load() <= before {
		t.Error("a 410 should count as a watch restart")
	}
	api.mu.Lock()
	if api.tokens[0] != "Bearer tok-1" {
		t.Errorf("token %q", api.tokens[0])
	}
	api.mu.Unlock()
}

func TestKubeWatchFollowsEvents(t *testing.T) {
	t0 := time.Unix(3000, 0)
	ip := "198.18.0.10"
	running := podJSON("a", ip, "Running", t0, annotationFor("s-a", "[]"), true)
	api := &fakeAPI{rv: "1", streams: [][]string{{
		event("ADDED", podJSON("p", "", "Pending", t0, annotationFor("s-a", "[]"), true)),
		event("MODIFIED", running),
	}}}
	srv := httptest.NewServer(api)
	defer srv.Close()
	k := &KubeSource{Server: srv.URL}
	s := NewStore()
	ready := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go k.Watch(ctx, "", s, quiet, ready)
	<-ready
	addr := netip.MustParseAddr(ip)
	waitFor(t, func() bool { return s.Lookup(addr) != nil && s.Lookup(addr).UID == "a" })
	if s.Lookup(netip.MustParseAddr("198.18.0.11")) != nil {
		t.Fatal("unknown address bound")
	}
}

func TestClaimOf(t *testing.T) {
	t0 := time.Unix(0, 0)
	good := annotationFor("s", "[]")
	cases := map[string]struct {
		pod   map[string]any
		claim bool
		bound bool
	}{
		"running":        {podJSON("a", "198.18.0.1", "Running", t0, good, true), true, true},
		"pending":        {podJSON("a", "198.18.0.1", "Pending", t0, good, true), true, true},
		"pending no ip":  {podJSON("a", "", "Pending", t0, good, true), false, false},
		"succeeded":      {podJSON("a", "198.18.0.1", "Succeeded", t0, good, true), false, false},
		"failed":         {podJSON("a", "198.18.0.1", "Failed", t0, good, true), false, false},
		"no ip":          {podJSON("a", "", "Running", t0, good, true), false, false},
		"unlabelled":     {podJSON("a", "198.18.0.1", "Running", t0, good, false), false, false},
		"bad annotation": {podJSON("a", "198.18.0.1", "Running", t0, "{", true), true, false},
		"other ns":       {podJSON("a", "198.18.0.1", "Running", t0, strings.Replace(good, `"namespace":"ns"`, `"namespace":"victim"`, 1), true), true, false},
	}
	for name, c := range cases {
		data, _ := json.Marshal(c.pod)
		var p pod
		json.Unmarshal(data, &p)
		claim, ok := claimOf(&p, nil, quiet)
		if ok != c.claim || (claim.Binding != nil) != c.bound {
			t.Errorf("%s: claim %v bound %v", name, ok, claim.Binding != nil)
		}
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 5 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// sign is the operator's signature (operator/corral_operator/builders/egress.py), written
// out independently here so the two sides are checked against each other's definition.
func sign(key, namespace, pod, text string) string {
	mac := hmac.New(sha256.New, []byte(key))
	mac.Write([]byte("corral.dev/egress-binding/v1\n" + namespace + "\n" + pod + "\n" + text))
	return hex.EncodeToString(mac.Sum(nil))
}

func TestWithAKeyOnlyTheOperatorsSignatureBindsAPod(t *testing.T) {
	key := strings.Repeat("k", 40)
	good := annotationFor("s", "[]")
	signed := func(signature string) *pod {
		m := podJSON("a", "198.18.0.1", "Running", time.Unix(0, 0), good, true)
		if signature != "" {
			m["metadata"].(map[string]any)["annotations"].(map[string]any)[SignatureAnnotation] = signature
		}
		data, _ := json.Marshal(m)
		var p pod
		json.Unmarshal(data, &p)
		return &p
	}
	cases := map[string]struct {
		signature string
		bound     bool
	}{
		"signed for this pod":     {sign(key, "ns", "p-a", good), true},
		"unsigned":                {"", false},
		"signed for another pod":  {sign(key, "ns", "p-other", good), false},
		"signed in another ns":    {sign(key, "victim", "p-a", good), false},
		"signed with another key": {sign(strings.Repeat("j", 40), "ns", "p-a", good), false},
		"not hex":                 {"zz", false},
	}
	for name, c := range cases {
		claim, ok := claimOf(signed(c.signature), []byte(key), quiet)
		// Claimed either way: an unsigned pod still holds its address, so no older pod's
		// binding on that address applies to its traffic.
		if !ok || (claim.Binding != nil) != c.bound {
			t.Errorf("%s: claim %v bound %v, want bound %v", name, ok, claim.Binding != nil, c.bound)
		}
	}
	// Without a key, the signature is not asked for.
	if claim, _ := claimOf(signed(""), nil, quiet); claim.Binding == nil {
		t.Error("without a key an unsigned binding should bind")
	}
}
