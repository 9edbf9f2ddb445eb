package bindings

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"time"
)

const fileScope = "file"

type fileEntry struct {
	IP      string          `json:"ip"`
	UID     string          `json:"uid"`
	Binding json.RawMessage `json:"binding"`
}

// WatchFile feeds the store from a JSON file (`[{"ip", "uid", "binding"}]`, the tests'
// stand-in for the pod watch), re-read whenever its modification time or size changes.
// ready is closed after the first successful read.
func WatchFile(ctx context.Context, path string, store *Store, log *slog.Logger, ready chan<- struct{}) {
	var seen os.FileInfo
	first := true
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		info, err := os.Stat(path)
		if err == nil && (seen == nil || !info.ModTime().Equal(seen.ModTime()) || info.Size() != seen.Size()) {
			if claims, err := readFile(path, log); err != nil {
				log.Warn("bindings file unreadable; keeping the bindings in force", "path", path, "error", err.Error())
			} else {
				seen = info
				store.Replace(fileScope, claims)
				if first {
					first = false
					close(ready)
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func readFile(path string, log *slog.Logger) ([]Claim, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var entries []fileEntry
	if err := json.Unmarshal(data, &entries); err != nil {
		return nil, err
	}
	claims := make([]Claim, 0, len(entries))
	base := time.Unix(0, 0)
	for i, e := range entries {
		addr, err := netip.ParseAddr(e.IP)
		if err != nil || e.UID == "" {
			return nil, fmt.Errorf("entry %d: bad ip or uid", i)
		}
		b, err := Parse(e.UID, e.Binding)
		if err != nil {
			log.Warn("binding does not parse; the source is unknown", "ip", e.IP, "uid", e.UID, "error", err.Error())
		}
		// A later entry for the same address wins, as a later pod would.
		claims = append(claims, Claim{UID: e.UID, Addrs: []netip.Addr{addr}, Created: base.Add(time.Duration(i)), Binding: b})
	}
	return claims, nil
}
