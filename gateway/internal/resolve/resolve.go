// Package resolve answers names for the gateway: a hosts file first (the test tiers' stand-in
// for public DNS), then DNS. It also spells a checked address as a name that only it can
// answer ("pinned"), which is what the engine (smokescreen) is handed, so the engine never
// looks a name up itself: the address dialled is the address the policy checked.
package resolve

import (
	"bufio"
	"context"
	"corral.dev/gateway/internal/policy"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Resolver is the hosts file (when given) in front of DNS.
type Resolver struct {
	HostsFile string
	DNS       *net.Resolver
	Timeout   time.Duration

	mu      sync.Mutex
	checked time.Time
	mtime   time.Time
	hosts   map[string][]netip.Addr
}

// Resolve answers every address of name (lower case, no trailing dot).
func (r *Resolver) Resolve(ctx context.Context, name string) ([]netip.Addr, error) {
	if addrs := r.fromHosts(name); len(addrs) > 0 {
		return addrs, nil
	}
	timeout := r.Timeout
	if timeout == 0 {
		timeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	dns := r.DNS
	if dns == nil {
		dns = net.DefaultResolver
	}
	// The trailing dot keeps the system's search domains out of it: the name is absolute,
	// unless the rule that matched it is the platform's (policy.RelativeNames).
	query := name + "."
	if policy.RelativeNames(ctx) {
		query = name
	}
	found, err := dns.LookupNetIP(ctx, "ip", query)
	if err != nil {
		return nil, err
	}
	out := make([]netip.Addr, len(found))
	for i, a := range found {
		out[i] = a.Unmap()
	}
	return out, nil
}

// fromHosts reads the hosts file again when it changed (checked at most every 100 ms).
func (r *Resolver) fromHosts(name string) []netip.Addr {
	if r.HostsFile == "" {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if now := time.Now(); now.Sub(r.checked) > 100*time.Millisecond {
		r.checked = now
		if info, err := os.Stat(r.HostsFile); err == nil && !info.ModTime().Equal(r.mtime) {
			if hosts, err := ParseHosts(r.HostsFile); err == nil {
				r.hosts, r.mtime = hosts, info.ModTime()
			}
		}
	}
	return r.hosts[name]
}

// ParseHosts reads /etc/hosts format: an address, then names; `#` starts a comment.
func ParseHosts(path string) (map[string][]netip.Addr, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	hosts := map[string][]netip.Addr{}
	scan := bufio.NewScanner(f)
	for scan.Scan() {
		line, _, _ := strings.Cut(scan.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		addr, err := netip.ParseAddr(fields[0])
		if err != nil {
			continue
		}
		for _, name := range fields[1:] {
			name = strings.TrimSuffix(strings.ToLower(name), ".")
			hosts[name] = append(hosts[name], addr.Unmap())
		}
	}
	return hosts, scan.Err()
}

// pinnedSuffix is under .invalid (RFC 6761): no real name can collide with a pinned one.
const pinnedSuffix = ".pinned.corral.invalid"

// Pin spells an address as a name: `ip4-198-51-100-7.pinned.corral.invalid`, or `ip6-` and
// the 32 hex digits of an IPv6 address (smokescreen's ACL path refuses IPv6 literals).
func Pin(a netip.Addr) string {
	a = a.Unmap()
	if a.Is4() {
		b := a.As4()
		return fmt.Sprintf("ip4-%d-%d-%d-%d%s", b[0], b[1], b[2], b[3], pinnedSuffix)
	}
	b := a.As16()
	return fmt.Sprintf("ip6-%x%s", b[:], pinnedSuffix)
}

var ErrNotPinned = errors.New("the engine may resolve only addresses the policy pinned")

// Unpin reads a pinned name back (lower case, an optional trailing dot).
func Unpin(name string) (netip.Addr, error) {
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	body, ok := strings.CutSuffix(name, pinnedSuffix)
	if !ok {
		return netip.Addr{}, ErrNotPinned
	}
	if v4, ok := strings.CutPrefix(body, "ip4-"); ok {
		parts := strings.Split(v4, "-")
		if len(parts) != 4 {
			return netip.Addr{}, ErrNotPinned
		}
		var b [4]byte
		for i, p := range parts {
			n, err := strconv.ParseUint(p, 10, 8)
			if err != nil {
				return netip.Addr{}, ErrNotPinned
			}
			b[i] = byte(n)
		}
		return netip.AddrFrom4(b), nil
	}
	if v6, ok := strings.CutPrefix(body, "ip6-"); ok && len(v6) == 32 {
		var b [16]byte
		for i := range b {
			n, err := strconv.ParseUint(v6[2*i:2*i+2], 16, 8)
			if err != nil {
				return netip.Addr{}, ErrNotPinned
			}
			b[i] = byte(n)
		}
		return netip.AddrFrom16(b), nil
	}
	return netip.Addr{}, ErrNotPinned
}

// Pinned is the resolver the engine gets (smokescreen.Resolver): it answers pinned names
// and nothing else, so a name the policy did not check can never be looked up and dialled.
type Pinned struct{}

func (Pinned) LookupPort(_ context.Context, _, service string) (int, error) {
	port, err := strconv.Atoi(service)
	if err != nil || port < 1 || port > 65535 {
		return 0, fmt.Errorf("bad port %q", service)
	}
	return port, nil
}

func (Pinned) LookupIP(_ context.Context, _, host string) ([]net.IP, error) {
	a, err := Unpin(host)
	if err != nil {
		return nil, err
	}
	return []net.IP{net.IP(a.AsSlice())}, nil
}
