package policy

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"strings"
)

const (
	IdentityAgent     = "agent"
	IdentityCustodian = "custodian"
)

// ErrBadCredential: a Proxy-Authorization that is not the binding's custodian credential.
var ErrBadCredential = errors.New("the Proxy-Authorization does not match this sandbox's custodian credential")

// Identify tells the two identities of a pod apart: no Proxy-Authorization is the agent; a
// Basic credential whose password hashes to the binding's digest is the custodian; anything
// else (forged, stale after rotation, malformed, several headers, or any credential where the
// binding has no custodian) is refused, never served as the agent's. The user name is not
// read: the digest alone is the secret's proof.
func Identify(digestHex string, headers []string) (string, error) {
	if len(headers) == 0 {
		return IdentityAgent, nil
	}
	want, err := hex.DecodeString(digestHex)
	if len(headers) != 1 || err != nil || len(want) != sha256.Size {
		return "", ErrBadCredential
	}
	scheme, encoded, ok := strings.Cut(strings.TrimSpace(headers[0]), " ")
	if !ok || !strings.EqualFold(scheme, "basic") {
		return "", ErrBadCredential
	}
	pair, err := base64.StdEncoding.DecodeString(strings.TrimSpace(encoded))
	if err != nil {
		return "", ErrBadCredential
	}
	_, password, ok := strings.Cut(string(pair), ":")
	if !ok {
		return "", ErrBadCredential
	}
	got := sha256.Sum256([]byte(password))
	if subtle.ConstantTimeCompare(got[:], want) != 1 {
		return "", ErrBadCredential
	}
	return IdentityCustodian, nil
}
