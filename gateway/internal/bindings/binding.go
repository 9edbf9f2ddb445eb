// Package bindings maps a source address to the binding of the pod that has it: the Session,
// the Agent, the digest of the custodian's proxy credential and each identity's rules, as the
// operator writes them in the pod's `corral.dev/egress-binding` annotation.
package bindings

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"corral.dev/gateway/internal/policy"
)

const (
	SignatureAnnotation = "corral.dev/egress-binding-signature"
	// signatureContext opens every signed message: a MAC made for anything else never matches.
	signatureContext = "corral.dev/egress-binding/v1"
	Label            = "corral.dev/egress"
	LabelValue       = "gateway"
	Annotation       = "corral.dev/egress-binding"
	version          = 1
	LabelSelector    = Label + "=" + LabelValue
)

// Binding is one pod's egress binding.
type Binding struct {
	UID              string
	Namespace        string
	Session          string // "" for an Evidence's pod
	Agent            string
	CredentialSHA256 string // "" when the pod has no custodian
	AgentRules       []policy.Rule
	CustodianRules   []policy.Rule
	CheckoutRules    []policy.Rule
	// Digest is the SHA-256 of the annotation text as read: the operator waits for it before
	// it lets a re-bound pod act on the new binding (a warm pod's adoption).
	Digest string
}

// HasCustodian: a credential exists to present.
func (b *Binding) HasCustodian() bool { return b.CredentialSHA256 != "" }

type annotation struct {
	V                *int            `json:"v"`
	Namespace        string          `json:"namespace"`
	Session          string          `json:"session"`
	Agent            string          `json:"agent"`
	CredentialSHA256 string          `json:"credentialSha256"`
	AgentRules       json.RawMessage `json:"agentRules"`
	CustodianRules   json.RawMessage `json:"custodianRules"`
	CheckoutRules    json.RawMessage `json:"checkoutRules"`
}

// Parse reads the annotation's JSON; any error makes the pod unknown.
func Parse(uid string, data []byte) (*Binding, error) {
	var a annotation
	if err := json.Unmarshal(data, &a); err != nil {
		return nil, err
	}
	if a.V == nil || *a.V != version {
		return nil, fmt.Errorf("binding version %v, want %d", a.V, version)
	}
	if a.Namespace == "" || (a.Session != "" && a.Agent == "") {
		// An Evidence's pod has neither Session nor Agent; a Session's has both.
		return nil, errors.New("binding without namespace, or a Session's without agent")
	}
	if d := a.CredentialSHA256; d != "" && !isHexDigest(d) {
		return nil, errors.New("credentialSha256 is not a SHA-256 hex digest")
	}
	sum := sha256.Sum256(data)
	b := &Binding{UID: uid, Namespace: a.Namespace, Session: a.Session, Agent: a.Agent,
		CredentialSHA256: a.CredentialSHA256, Digest: hex.EncodeToString(sum[:])}
	var err error
	if b.AgentRules, err = policy.ParseRules(a.AgentRules); err != nil {
		return nil, fmt.Errorf("agentRules: %w", err)
	}
	if b.CustodianRules, err = policy.ParseRules(a.CustodianRules); err != nil {
		return nil, fmt.Errorf("custodianRules: %w", err)
	}
	if b.CheckoutRules, err = policy.ParseRules(a.CheckoutRules); err != nil {
		return nil, fmt.Errorf("checkoutRules: %w", err)
	}
	return b, nil
}

func isHexDigest(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// Signed reports whether signature is the operator's HMAC-SHA256 of the binding text for this
// pod name in this namespace (so a copied annotation does not verify on another pod).
func Signed(key []byte, namespace, pod, text, signature string) bool {
	got, err := hex.DecodeString(signature)
	if err != nil || len(got) != sha256.Size {
		return false
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(signatureContext + "\n" + namespace + "\n" + pod + "\n" + text))
	return hmac.Equal(got, mac.Sum(nil))
}
