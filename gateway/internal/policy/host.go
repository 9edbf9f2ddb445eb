// Package policy decides whether a request may leave: the destination's syntax, the rule that
// matches it (host or CIDR, port, method), the address it resolves to and the ranges no sandbox
// reaches unless a rule names them. It is pure: the resolver is the only thing it calls out to.
package policy

import (
	"errors"
	"net/netip"
	"strconv"
	"strings"
)

// Host is a destination as the gateway judges it: a normalised DNS name or an address.
type Host struct {
	Name string     // lower case, no trailing dot; empty when Addr is set
	Addr netip.Addr // unmapped (an IPv4-mapped IPv6 address is its IPv4 address)
}

func (h Host) IsAddr() bool { return h.Addr.IsValid() }

// String is the host as written in messages and records (IPv6 without brackets).
func (h Host) String() string {
	if h.IsAddr() {
		return h.Addr.String()
	}
	return h.Name
}

// HostPort joins the host and a port the way an authority is written.
func (h Host) HostPort(port uint16) string {
	if h.IsAddr() {
		return netip.AddrPortFrom(h.Addr, port).String()
	}
	return h.Name + ":" + strconv.Itoa(int(port))
}

var ErrBadHost = errors.New("not a valid host name or address")

// ParseHost normalises a destination host as a client wrote it in a CONNECT authority or an
// absolute URL: lower case, one trailing dot dropped; an IPv6 literal must come in brackets,
// an IPv4 literal must not. Anything else must be an ASCII DNS name (punycode for
// internationalised names).
//
// Numeric spellings of an address other than dotted-quad (`2852039166`, `0xa9fea9fe`,
// `0251.0376.0251.0376`, `169.254.43518`) are refused as bad hosts rather than read as the
// address they mean: no DNS name ends in an all-numeric or hex label, so only an address
// parser's leniency could give them a meaning, and refusing them leaves one spelling per
// address to judge.
func ParseHost(raw string) (Host, error) {
	s := strings.ToLower(raw)
	if strings.HasPrefix(s, "[") {
		if !strings.HasSuffix(s, "]") {
			return Host{}, ErrBadHost
		}
		addr, err := netip.ParseAddr(s[1 : len(s)-1])
		if err != nil || !addr.Is6() || addr.Zone() != "" {
			return Host{}, ErrBadHost
		}
		return Host{Addr: addr.Unmap()}, nil
	}
	s = strings.TrimSuffix(s, ".")
	if addr, err := netip.ParseAddr(s); err == nil {
		if !addr.Is4() {
			return Host{}, ErrBadHost // a bare IPv6 literal is not an authority
		}
		return Host{Addr: addr}, nil
	}
	if !validName(s) {
		return Host{}, ErrBadHost
	}
	return Host{Name: s}, nil
}

// validName: labels of letters, digits, hyphens (and underscores, common in practice) of 1-63
// characters, no label starting or ending with a hyphen, at most 253 characters, and a last
// label that is not numeric (see ParseHost).
func validName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	labels := strings.Split(s, ".")
	for _, label := range labels {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return !numericLabel(labels[len(labels)-1])
}

func numericLabel(label string) bool {
	digits := strings.TrimPrefix(label, "0x")
	if digits != label {
		return true // 0x... is how address parsers spell hex; no TLD starts so
	}
	for i := 0; i < len(label); i++ {
		if label[i] < '0' || label[i] > '9' {
			return false
		}
	}
	return true
}

// ParseAuthority splits a CONNECT target (`host:port`, `[v6]:port`); the port is required.
func ParseAuthority(authority string) (Host, uint16, error) {
	i := strings.LastIndexByte(authority, ':')
	if i < 0 || strings.LastIndexByte(authority, ']') > i {
		return Host{}, 0, ErrBadHost
	}
	port, err := parsePort(authority[i+1:])
	if err != nil {
		return Host{}, 0, err
	}
	host, err := ParseHost(authority[:i])
	return host, port, err
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 || s[0] == '0' || s[0] == '+' {
		return 0, ErrBadHost
	}
	return uint16(n), nil
}

// ParseURLHost splits the host of an absolute http:// URL; no port means 80.
func ParseURLHost(hostport string) (Host, uint16, error) {
	if hostport == "" {
		return Host{}, 0, ErrBadHost
	}
	if i := strings.LastIndexByte(hostport, ':'); i >= 0 && strings.LastIndexByte(hostport, ']') < i {
		return ParseAuthority(hostport)
	}
	host, err := ParseHost(hostport)
	return host, 80, err
}
