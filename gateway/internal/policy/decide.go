package policy

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Reason says why a request was refused, in words an agent can act on; the code travels in
// the X-Corral-Egress-Reason header and the records.
type Reason string

const (
	Allowed          Reason = ""
	NotAllowed       Reason = "not-allowed"
	PortNotAllowed   Reason = "port-not-allowed"
	MethodNotAllowed Reason = "method-not-allowed"
	PrivateAddress   Reason = "private-address"
	UnknownSource    Reason = "unknown-source"
	BadCredential    Reason = "bad-credential"
	BadHost          Reason = "bad-host"
	BadRequest       Reason = "bad-request"
	Unreachable      Reason = "upstream-unreachable"
	Timeout          Reason = "timeout"
)

// Status is the HTTP status a refusal answers with.
func (r Reason) Status() int {
	switch r {
	case BadCredential:
		return 407
	case Unreachable:
		return 502
	case Timeout:
		return 504
	case BadRequest:
		return 400
	default:
		return 403
	}
}

type relativeKey struct{}

// WithRelativeNames marks a lookup that may use the system's search domains.
func WithRelativeNames(ctx context.Context) context.Context {
	return context.WithValue(ctx, relativeKey{}, true)
}

// RelativeNames reports whether this lookup may use the system's search domains; otherwise
// the name is absolute (a user's `pypi.org` never becomes `pypi.org.<namespace>.svc...`).
func RelativeNames(ctx context.Context) bool {
	v, _ := ctx.Value(relativeKey{}).(bool)
	return v
}

// Resolver answers every address a name has (the gateway checks them all and dials one).
type Resolver interface {
	Resolve(ctx context.Context, name string) ([]netip.Addr, error)
}

// Request is what a client asked for: the destination and, for plain http, the method
// (empty for a CONNECT).
type Request struct {
	Host   Host
	Port   uint16
	Method string
}

// Verdict is a decision. An allowed verdict carries the one address to dial, already
// checked; Exempt says it lies in a refused range that a rule let through.
type Verdict struct {
	Reason Reason
	Dial   netip.AddrPort
	Exempt bool
	Detail string // what the message adds: allowed ports or methods, the refused address
}

func (v Verdict) Allowed() bool { return v.Reason == Allowed }

// Decide judges req against rules: a host rule matches names (or its literal), a cidr rule
// the address to dial. A name is resolved once, and only when some rule could match it
// (a name no rule names is refused without a lookup); every address it resolved to is
// checked and the first one a rule reaches is the one to dial, so a name that rebinds
// between a check and a dial cannot happen: there is no second lookup.
func Decide(ctx context.Context, rules []Rule, req Request, ranges Ranges, resolver Resolver) Verdict {
	var byHost, byCIDR []Rule
	for _, r := range rules {
		switch {
		case r.isCIDR():
			byCIDR = append(byCIDR, r)
		case r.matchesHost(req.Host):
			byHost = append(byHost, r)
		}
	}
	var addrs []netip.Addr
	if req.Host.IsAddr() {
		addrs = []netip.Addr{req.Host.Addr}
	} else {
		if len(byHost) == 0 && len(byCIDR) == 0 {
			return Verdict{Reason: NotAllowed}
		}
		// Before any lookup, a host rule's port and method may already refuse.
		if len(byCIDR) == 0 {
			if v, refused := portAndMethod(byHost, req); refused {
				return v
			}
		}
		lookup := ctx
		for _, r := range byHost {
			if r.Private {
				// A platform-named host (the API server as kubernetes.default.svc) may be
				// relative to the cluster's search domains; a user's never is.
				lookup = WithRelativeNames(ctx)
				break
			}
		}
		found, err := resolver.Resolve(lookup, req.Host.Name)
		if err != nil || len(found) == 0 {
			if len(byHost) == 0 {
				return Verdict{Reason: NotAllowed}
			}
			if errors.Is(err, context.DeadlineExceeded) {
				return Verdict{Reason: Timeout, Detail: "resolving the name timed out"}
			}
			return Verdict{Reason: Unreachable, Detail: "the name does not resolve"}
		}
		addrs = found
	}

	best := Verdict{Reason: NotAllowed}
	for _, raw := range addrs {
		a := raw.Unmap()
		candidates := slices.Clone(byHost)
		for _, r := range byCIDR {
			if r.CIDR.Contains(a) {
				candidates = append(candidates, r)
			}
		}
		if len(candidates) == 0 {
			continue
		}
		v, refused := portAndMethod(candidates, req)
		if refused {
			best = moreSpecific(best, v)
			continue
		}
		for _, r := range candidates {
			if r.matchesPort(req.Port) && r.matchesMethod(req.Method) && ranges.reaches(r, a) {
				return Verdict{Dial: netip.AddrPortFrom(a, req.Port), Exempt: ranges.IsRefused(a)}
			}
		}
		best = moreSpecific(best, Verdict{Reason: PrivateAddress, Detail: a.String()})
	}
	return best
}

// portAndMethod refuses when no candidate rule takes the port, or none with the port takes
// the method.
func portAndMethod(candidates []Rule, req Request) (Verdict, bool) {
	var ports, methods []string
	portOK := false
	for _, r := range candidates {
		ports = append(ports, r.portsText())
		if !r.matchesPort(req.Port) {
			continue
		}
		portOK = true
		if r.matchesMethod(req.Method) {
			return Verdict{}, false
		}
		methods = append(methods, r.Methods...)
	}
	if !portOK {
		return Verdict{Reason: PortNotAllowed, Detail: strings.Join(unique(ports), ", ")}, true
	}
	return Verdict{Reason: MethodNotAllowed, Detail: strings.Join(unique(methods), ", ")}, true
}

var specificity = map[Reason]int{NotAllowed: 0, PortNotAllowed: 1, MethodNotAllowed: 2, PrivateAddress: 3}

// moreSpecific keeps the refusal that got furthest (a private address beats a wrong port).
func moreSpecific(a, b Verdict) Verdict {
	if specificity[b.Reason] > specificity[a.Reason] {
		return b
	}
	return a
}

func unique(items []string) []string {
	slices.Sort(items)
	return slices.Compact(items)
}

// Who a message speaks about.
type Who struct {
	Identity string // "agent" or "custodian"
	Agent    string
	Session  string
}

// Message is the refusal's text: what was refused, for whom, and what would allow it.
func (v Verdict) Message(who Who, req Request) string {
	target := req.Host.HostPort(req.Port)
	if req.Method != "" {
		target = req.Method + " http://" + target
	}
	subject := fmt.Sprintf("agent %q", who.Agent)
	remedy := "add it to the Agent's sandbox.egress"
	if who.Identity == "custodian" {
		subject = fmt.Sprintf("the custodian of session %q", who.Session)
		remedy = "the operator derives the custodian's destinations: its settings and --platform-egress"
	}
	switch v.Reason {
	case NotAllowed:
		return fmt.Sprintf("Corral egress: %s is not allowed for %s (%s)", target, subject, remedy)
	case PortNotAllowed:
		return fmt.Sprintf("Corral egress: %s is not allowed for %s: port %d is not among the rule's ports (%s) (%s)",
			target, subject, req.Port, v.Detail, remedy)
	case MethodNotAllowed:
		allowed := v.Detail
		if req.Method == "" {
			return fmt.Sprintf("Corral egress: CONNECT %s is not allowed for %s: its rule allows only plain http methods %s, and a tunnel's method is not visible",
				target, subject, allowed)
		}
		return fmt.Sprintf("Corral egress: %s is not allowed for %s: the rule allows methods %s", target, subject, allowed)
	case PrivateAddress:
		return fmt.Sprintf("Corral egress: %s is not allowed for %s: it is a private address (%s) that no rule names (write the address itself in a rule to reach it)",
			target, subject, v.Detail)
	case Unreachable:
		return fmt.Sprintf("Corral egress: %s could not be reached: %s", target, v.Detail)
	case Timeout:
		return fmt.Sprintf("Corral egress: %s timed out: %s", target, v.Detail)
	}
	return "Corral egress: " + target + " is allowed"
}
