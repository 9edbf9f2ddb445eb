package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Rule is one destination a binding allows, as the operator writes it (builders/egress.py):
// exactly one of a host (exact, `*.suffix`, or an IPv4 literal) and a CIDR, ports, methods of
// plain http requests, and `private` for the platform's destinations that may be private.
type Rule struct {
	Name     string       // exact name, or the suffix of a wildcard (Wildcard true)
	Wildcard bool         // `*.suffix`: names strictly under the suffix
	Literal  netip.Addr   // a host rule written as an address
	CIDR     netip.Prefix // a cidr rule
	Ports    []uint16
	Methods  []string
	Private  bool
}

type rawRule struct {
	Host    *string  `json:"host"`
	CIDR    *string  `json:"cidr"`
	Ports   []int    `json:"ports"`
	Methods []string `json:"methods"`
	Private bool     `json:"private"`
}

// ParseRule reads one rule; an invalid rule is an error (the binding holding it is unknown:
// failing closed beats guessing what a malformed rule meant).
func ParseRule(data []byte) (Rule, error) {
	var raw rawRule
	dec := json.NewDecoder(strings.NewReader(string(data)))
	if err := dec.Decode(&raw); err != nil {
		return Rule{}, err
	}
	var r Rule
	switch {
	case raw.Host != nil && raw.CIDR != nil, raw.Host == nil && raw.CIDR == nil:
		return Rule{}, errors.New("a rule has exactly one of host and cidr")
	case raw.Host != nil:
		host := strings.ToLower(strings.TrimSuffix(*raw.Host, "."))
		if suffix, ok := strings.CutPrefix(host, "*."); ok {
			if !validName(suffix) {
				return Rule{}, fmt.Errorf("bad wildcard host %q", *raw.Host)
			}
			r.Name, r.Wildcard = suffix, true
		} else if addr, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil && addr.Zone() == "" {
			r.Literal = addr.Unmap()
		} else if validName(host) {
			r.Name = host
		} else {
			return Rule{}, fmt.Errorf("bad host %q", *raw.Host)
		}
	default:
		prefix, err := netip.ParsePrefix(*raw.CIDR)
		if err != nil {
			return Rule{}, fmt.Errorf("bad cidr %q: %w", *raw.CIDR, err)
		}
		r.CIDR = unmapPrefix(prefix.Masked())
	}
	for _, p := range raw.Ports {
		if p < 1 || p > 65535 {
			return Rule{}, fmt.Errorf("bad port %d", p)
		}
		r.Ports = append(r.Ports, uint16(p))
	}
	for _, m := range raw.Methods {
		if m == "" || strings.ToUpper(m) != m || strings.ContainsAny(m, " \t\r\n") {
			return Rule{}, fmt.Errorf("bad method %q", m)
		}
		r.Methods = append(r.Methods, m)
	}
	r.Private = raw.Private
	return r, nil
}

// ParseRules reads a JSON list of rules (a null or missing list is empty).
func ParseRules(data json.RawMessage) ([]Rule, error) {
	if len(data) == 0 || string(data) == "null" {
		return nil, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(data, &items); err != nil {
		return nil, err
	}
	rules := make([]Rule, 0, len(items))
	for _, item := range items {
		r, err := ParseRule(item)
		if err != nil {
			return nil, err
		}
		rules = append(rules, r)
	}
	return rules, nil
}

// unmapPrefix turns an IPv4-mapped IPv6 prefix into the IPv4 prefix it covers.
func unmapPrefix(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		return netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p
}

func (r Rule) isCIDR() bool { return r.CIDR.IsValid() }

// matchesHost: the rule names this host (a cidr rule matches addresses, not hosts).
func (r Rule) matchesHost(h Host) bool {
	switch {
	case r.isCIDR():
		return false
	case r.Literal.IsValid():
		return h.IsAddr() && h.Addr == r.Literal
	case h.IsAddr():
		return false
	case r.Wildcard:
		return len(h.Name) > len(r.Name)+1 && strings.HasSuffix(h.Name, "."+r.Name)
	default:
		return h.Name == r.Name
	}
}

// matchesPort: empty ports mean 443 on a host rule and every port on a cidr rule.
func (r Rule) matchesPort(port uint16) bool {
	if len(r.Ports) == 0 {
		return r.isCIDR() || port == 443
	}
	return slices.Contains(r.Ports, port)
}

// matchesMethod: a CONNECT (method "") never matches a rule with methods: the method of what
// travels inside the tunnel is not visible.
func (r Rule) matchesMethod(method string) bool {
	if len(r.Methods) == 0 {
		return true
	}
	return method != "" && slices.Contains(r.Methods, method)
}

func (r Rule) portsText() string {
	if len(r.Ports) == 0 {
		if r.isCIDR() {
			return "any"
		}
		return "443"
	}
	out := make([]string, len(r.Ports))
	for i, p := range r.Ports {
		out[i] = fmt.Sprint(p)
	}
	return strings.Join(out, ", ")
}
