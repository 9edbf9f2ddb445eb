package bindings

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// KubeSource is where the pods are: the API server, its CA and a bearer token file (re-read
// on every request, so a rotated projected token is picked up).
type KubeSource struct {
	Server    string
	TokenFile string
	CAFile    string
	// Key, when set, is the key the operator signs bindings with: a binding without its
	// signature (someone else labelled and annotated a pod) leaves the pod unknown.
	Key []byte

	once      sync.Once
	client    *http.Client
	clientErr error
}

// Restarts counts watch restarts (re-lists and re-watches after an error, an expiry or the
// server closing the stream), for corral_gateway_watch_restarts_total.
var Restarts atomic.Uint64

func (k *KubeSource) httpClient() (*http.Client, error) {
	k.once.Do(func() { k.client, k.clientErr = k.newClient() })
	return k.client, k.clientErr
}

func (k *KubeSource) newClient() (*http.Client, error) {
	pool := x509.NewCertPool()
	if k.CAFile != "" {
		pem, err := os.ReadFile(k.CAFile)
		if err != nil {
			return nil, err
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s holds no certificate", k.CAFile)
		}
	}
	return &http.Client{Transport: &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		Proxy:               nil, // the gateway never sends its own calls through a proxy
		TLSHandshakeTimeout: 10 * time.Second,
	}}, nil
}

type podList struct {
	Metadata struct {
		ResourceVersion string `json:"resourceVersion"`
		Continue        string `json:"continue"`
	} `json:"metadata"`
	Items []pod `json:"items"`
}

type pod struct {
	Metadata struct {
		UID               string            `json:"uid"`
		Name              string            `json:"name"`
		Namespace         string            `json:"namespace"`
		ResourceVersion   string            `json:"resourceVersion"`
		CreationTimestamp time.Time         `json:"creationTimestamp"`
		Labels            map[string]string `json:"labels"`
		Annotations       map[string]string `json:"annotations"`
	} `json:"metadata"`
	Status struct {
		Phase  string `json:"phase"`
		PodIP  string `json:"podIP"`
		PodIPs []struct {
			IP string `json:"ip"`
		} `json:"podIPs"`
	} `json:"status"`
}

type watchEvent struct {
	Type   string          `json:"type"`
	Object json.RawMessage `json:"object"`
}

type status struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

var errGone = errors.New("resource version expired")

// claimOf: the pod's claim while it is Pending or Running with an address and the label; ok false when
// it holds none (its mapping, if any, is dropped).
func claimOf(p *pod, key []byte, log *slog.Logger) (Claim, bool) {
	// Pending counts once the pod has its address: its init containers (the checkout) run
	// then, and need their way out. A pod that has ended (Succeeded, Failed) holds nothing:
	// its address may already be another pod's.
	live := p.Status.Phase == "Running" || p.Status.Phase == "Pending"
	if p.Metadata.Labels[Label] != LabelValue || !live || p.Status.PodIP == "" {
		return Claim{}, false
	}
	var addrs []netip.Addr
	for _, raw := range append([]string{p.Status.PodIP}, podIPs(p)...) {
		if a, err := netip.ParseAddr(raw); err == nil && !contains(addrs, a.Unmap()) {
			addrs = append(addrs, a.Unmap())
		}
	}
	if len(addrs) == 0 {
		return Claim{}, false
	}
	c := Claim{UID: p.Metadata.UID, Addrs: addrs, Created: p.Metadata.CreationTimestamp}
	text := p.Metadata.Annotations[Annotation]
	b, err := Parse(p.Metadata.UID, []byte(text))
	switch {
	case key != nil && !Signed(key, p.Metadata.Namespace, p.Metadata.Name, text, p.Metadata.Annotations[SignatureAnnotation]):
		log.Warn("pod's egress binding is not signed by the operator; its address is unknown",
			"namespace", p.Metadata.Namespace, "pod", p.Metadata.Name)
	case err != nil:
		log.Warn("pod's egress binding does not parse; its address is unknown",
			"namespace", p.Metadata.Namespace, "pod", p.Metadata.Name, "error", err.Error())
	case b.Namespace != p.Metadata.Namespace:
		// A pod speaks only for its own namespace's Sessions.
		log.Warn("pod's egress binding names another namespace; its address is unknown",
			"namespace", p.Metadata.Namespace, "pod", p.Metadata.Name, "binding_namespace", b.Namespace)
	default:
		c.Binding = b
	}
	// A claim with no binding still holds the address, so an older pod's binding on it
	// does not apply to this pod's traffic.
	return c, true
}

func podIPs(p *pod) []string {
	out := make([]string, 0, len(p.Status.PodIPs))
	for _, ip := range p.Status.PodIPs {
		out = append(out, ip.IP)
	}
	return out
}

func contains(addrs []netip.Addr, a netip.Addr) bool {
	for _, b := range addrs {
		if a == b {
			return true
		}
	}
	return false
}

// Watch lists and then watches the labelled pods of one namespace ("" for all), feeding the
// store, until ctx ends: a list gives the state and a resourceVersion, the watch follows
// from there, bookmarks move it on, an expired version (410) means a fresh list, and an
// error backs off (doubling to 30 s, with jitter) before trying again. ready is closed after
// the first list.
func (k *KubeSource) Watch(ctx context.Context, namespace string, store *Store, log *slog.Logger, ready chan<- struct{}) {
	backoff := 200 * time.Millisecond
	first := true
	for ctx.Err() == nil {
		rv, err := k.list(ctx, namespace, store, log)
		if err == nil {
			if first {
				first = false
				close(ready)
			}
			backoff = 200 * time.Millisecond
			for ctx.Err() == nil {
				rv, err = k.watch(ctx, namespace, rv, store, log)
				if err != nil {
					break
				}
				Restarts.Add(1) // the server ended the stream (its timeout): watch on from rv
			}
		}
		if ctx.Err() != nil {
			return
		}
		Restarts.Add(1)
		if errors.Is(err, errGone) {
			log.Info("pod watch expired; listing again", "namespace", namespace)
			continue
		}
		log.Warn("pod watch failed; retrying", "namespace", namespace, "error", err.Error(), "backoff", backoff.String())
		wait := backoff/2 + rand.N(backoff/2+1)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		backoff = min(backoff*2, 30*time.Second)
	}
}

func (k *KubeSource) podsURL(namespace string, query url.Values) string {
	path := "/api/v1/pods"
	if namespace != "" {
		path = "/api/v1/namespaces/" + url.PathEscape(namespace) + "/pods"
	}
	query.Set("labelSelector", LabelSelector)
	return strings.TrimSuffix(k.Server, "/") + path + "?" + query.Encode()
}

func (k *KubeSource) get(ctx context.Context, u string) (*http.Response, error) {
	client, err := k.httpClient()
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	if k.TokenFile != "" {
		token, err := os.ReadFile(k.TokenFile)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		if resp.StatusCode == http.StatusGone {
			return nil, errGone
		}
		return nil, fmt.Errorf("GET %s: %s: %s", req.URL.Path, resp.Status, strings.TrimSpace(string(body)))
	}
	return resp, nil
}

func (k *KubeSource) list(ctx context.Context, namespace string, store *Store, log *slog.Logger) (string, error) {
	var claims []Claim
	next := ""
	for {
		q := url.Values{"limit": {"500"}}
		if next != "" {
			q.Set("continue", next)
		}
		lctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		resp, err := k.get(lctx, k.podsURL(namespace, q))
		if err != nil {
			cancel()
			return "", err
		}
		var page podList
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		cancel()
		if err != nil {
			return "", err
		}
		for i := range page.Items {
			if c, ok := claimOf(&page.Items[i], k.Key, log); ok {
				claims = append(claims, c)
			}
		}
		if page.Metadata.Continue == "" {
			store.Replace(scopeOf(namespace), claims)
			return page.Metadata.ResourceVersion, nil
		}
		next = page.Metadata.Continue
	}
}

func scopeOf(namespace string) string { return "ns/" + namespace }

// watch follows events from rv until the stream ends; it answers the last resourceVersion
// seen, and an error when the stream failed (errGone for an expired version).
func (k *KubeSource) watch(ctx context.Context, namespace, rv string, store *Store, log *slog.Logger) (string, error) {
	q := url.Values{
		"watch":               {"1"},
		"resourceVersion":     {rv},
		"allowWatchBookmarks": {"true"},
		"timeoutSeconds":      {fmt.Sprint(240 + rand.N(120))},
	}
	resp, err := k.get(ctx, k.podsURL(namespace, q))
	if err != nil {
		return rv, err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(bufio.NewReader(resp.Body))
	scope := scopeOf(namespace)
	for {
		var ev watchEvent
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) {
				return rv, nil
			}
			return rv, err
		}
		switch ev.Type {
		case "ERROR":
			var st status
			_ = json.Unmarshal(ev.Object, &st)
			if st.Code == http.StatusGone {
				return rv, errGone
			}
			return rv, fmt.Errorf("watch error %d: %s", st.Code, st.Message)
		case "ADDED", "MODIFIED", "DELETED", "BOOKMARK":
			var p pod
			if err := json.Unmarshal(ev.Object, &p); err != nil {
				return rv, err
			}
			if p.Metadata.ResourceVersion != "" {
				rv = p.Metadata.ResourceVersion
			}
			if ev.Type == "BOOKMARK" {
				continue
			}
			if c, ok := claimOf(&p, k.Key, log); ok && ev.Type != "DELETED" {
				store.Put(scope, c)
			} else {
				store.Drop(scope, p.Metadata.UID)
			}
		}
	}
}
