package policy

import "net/netip"

// RefusedByDefault are the ranges no sandbox reaches unless a rule names them (or
// --allow-range treats them as public): loopback, RFC 1918, CGNAT, link-local (the cloud
// metadata address 169.254.169.254), "this network", benchmarking (198.18/15, where the test
// tiers put pods and services), IETF protocol assignments, multicast and reserved; for IPv6
// the unspecified, loopback and IPv4-compatible block, unique-local, link- and site-local,
// multicast, and the prefixes that embed an IPv4 address (NAT64, 6to4, Teredo), which would
// otherwise carry a refused IPv4 address past the check. An IPv4-mapped address is unmapped
// before any check, so it is judged as its IPv4 address.
var RefusedByDefault = mustPrefixes(
	"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
	"172.16.0.0/12", "192.0.0.0/24", "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/4",
	"240.0.0.0/4",
	"::/96", "::1/128", "64:ff9b::/96", "100::/64", "2001::/32", "2002::/16", "fc00::/7",
	"fe80::/10", "fec0::/10", "ff00::/8",
)

func mustPrefixes(cidrs ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(cidrs))
	for i, c := range cidrs {
		out[i] = netip.MustParsePrefix(c)
	}
	return out
}

// Ranges are the refused ranges (the defaults plus --deny-cidr) and the ranges treated as
// public although refused (--allow-range).
type Ranges struct {
	Refused []netip.Prefix
	Allowed []netip.Prefix
}

// NewRanges: the default refused ranges plus `deny`; `allow` exempts addresses from both.
func NewRanges(deny, allow []netip.Prefix) Ranges {
	refused := append(append([]netip.Prefix{}, RefusedByDefault...), unmapAll(deny)...)
	return Ranges{Refused: refused, Allowed: unmapAll(allow)}
}

func unmapAll(ps []netip.Prefix) []netip.Prefix {
	out := make([]netip.Prefix, len(ps))
	for i, p := range ps {
		out[i] = unmapPrefix(p.Masked())
	}
	return out
}

// IsRefused: the address is in a refused range and not in an allowed one.
func (r Ranges) IsRefused(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range r.Allowed {
		if p.Contains(a) {
			return false
		}
	}
	for _, p := range r.Refused {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// inside: the prefix lies wholly within one refused range (a user who wrote it named a
// private address on purpose; 0.0.0.0/0 does not count, it names no address in particular).
func (r Ranges) inside(p netip.Prefix) bool {
	for _, q := range r.Refused {
		if q.Bits() <= p.Bits() && q.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

// reaches: may rule r dial address a? A refused address needs a private rule, or a user rule
// that wrote the address (a literal host, or a cidr inside a refused range).
func (r Ranges) reaches(rule Rule, a netip.Addr) bool {
	if !r.IsRefused(a) || rule.Private {
		return true
	}
	if rule.Literal.IsValid() {
		return rule.Literal == a
	}
	return rule.isCIDR() && r.inside(rule.CIDR)
}
