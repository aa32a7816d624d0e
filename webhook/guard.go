package webhook

import (
	"fmt"
	"net/netip"
	"strings"
	"syscall"
)

// alwaysBlocked lists the destinations refused even when DenyCIDRs is empty: link-local ranges, which is where
// cloud providers serve instance metadata and credentials. Only AllowCIDRs can reopen them.
var alwaysBlocked = []struct {
	prefix netip.Prefix
	reason string
}{
	{netip.MustParsePrefix("169.254.169.254/32"), "link-local (cloud metadata)"},
	{netip.MustParsePrefix("fd00:ec2::254/128"), "a cloud metadata address"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	// Unspecified addresses: Linux connects 0.0.0.0 and :: to the host itself, past any deny list that names
	// loopback; no receiver is legitimately addressed so.
	{netip.MustParsePrefix("0.0.0.0/8"), "unspecified (connects to this host)"},
	{netip.MustParsePrefix("::/128"), "unspecified (connects to this host)"},
}

// embeddedIPv4 returns the IPv4 address that an IPv6 address carries for a translation or tunnel mechanism
// that may route it to that IPv4 host: NAT64 (64:ff9b::/96, RFC 6052), 6to4 (2002::/16, RFC 3056) and the
// deprecated IPv4-compatible form (::a.b.c.d, RFC 4291 §2.5.5.1).
func embeddedIPv4(a netip.Addr) (netip.Addr, bool) {
	if !a.Is6() || a.Is4In6() {
		return netip.Addr{}, false
	}
	b := a.As16()
	switch {
	case netip.MustParsePrefix("64:ff9b::/96").Contains(a), netip.MustParsePrefix("::/96").Contains(a) && a != netip.IPv6Unspecified() && a != netip.IPv6Loopback():
		return netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]}), true
	case netip.MustParsePrefix("2002::/16").Contains(a):
		return netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]}), true
	}
	return netip.Addr{}, false
}

// blockedError reports a dial refused by the guard. It travels up through net.OpError and url.Error, and
// Send turns it into a terminal Result whose Message is its text.
type blockedError struct {
	addr   netip.Addr // the address that was about to be dialed, unmapped, without zone
	reason string     // why, e.g. "link-local (cloud metadata)" or "in denied range 10.0.0.0/8"
}

func (e *blockedError) Error() string {
	if !e.addr.IsValid() {
		return "blocked: " + e.reason
	}
	return fmt.Sprintf("blocked: %s is %s", e.addr, e.reason)
}

// guard decides, for each address about to be dialed, whether the connection may proceed.
// It is immutable after construction and safe for concurrent use.
type guard struct {
	deny  []netip.Prefix
	allow []netip.Prefix
}

func newGuard(deny, allow []netip.Prefix) *guard {
	return &guard{deny: normalizePrefixes(deny), allow: normalizePrefixes(allow)}
}

// check returns nil when addr may be dialed and a *blockedError otherwise. AllowCIDRs wins over both the
// built-in link-local/metadata list and DenyCIDRs; everything not refused (loopback, private ranges, public
// addresses) is allowed.
func (g *guard) check(addr netip.Addr) error {
	addr = addr.Unmap().WithZone("") // Prefix.Contains never matches a zoned or 4-in-6 address
	if v4, ok := embeddedIPv4(addr); ok {
		if err := g.check(v4); err != nil {
			inner := err.(*blockedError)
			return &blockedError{addr: addr, reason: "an IPv6 form of " + v4.String() + ", which is " + inner.reason}
		}
	}
	for _, p := range g.allow {
		if p.Contains(addr) {
			return nil
		}
	}
	for _, b := range alwaysBlocked {
		if b.prefix.Contains(addr) {
			return &blockedError{addr: addr, reason: b.reason}
		}
	}
	for _, p := range g.deny {
		if p.Contains(addr) {
			return &blockedError{addr: addr, reason: "in denied range " + p.String()}
		}
	}
	return nil
}

// control is a net.Dialer.Control function. It runs after name resolution and before connect(2), with the
// literal IP about to be dialed, so a DNS answer that changes between a check and the dial cannot bypass it.
func (g *guard) control(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		// Fail closed: an address the guard cannot read is an address it cannot vouch for.
		return &blockedError{reason: fmt.Sprintf("cannot check dialed address %q (%s)", address, network)}
	}
	return g.check(ap.Addr())
}

// ParseCIDRs parses a comma-separated list of CIDR prefixes such as "10.0.0.0/8, fd00::/8". A bare address is
// taken as a single-host prefix (/32 or /128), blanks around entries are ignored, and an empty string yields
// an empty list. Prefixes are masked ("10.1.2.3/8" becomes "10.0.0.0/8") and IPv4-mapped IPv6 prefixes are
// turned into their IPv4 form, matching how dialed addresses are checked. It returns an error naming the first
// entry that is not a prefix or an address. It is the one parser of PULSE_DENY_CIDRS and PULSE_ALLOW_CIDRS (config
// validates with it).
func ParseCIDRs(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for entry := range strings.SplitSeq(s, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		var p netip.Prefix
		if strings.Contains(entry, "/") {
			var err error
			if p, err = netip.ParsePrefix(entry); err != nil {
				return nil, fmt.Errorf("parse CIDR %q: want an address/prefix-length such as 10.0.0.0/8", entry)
			}
		} else {
			a, err := netip.ParseAddr(entry)
			if err != nil || a.Zone() != "" {
				return nil, fmt.Errorf("parse CIDR %q: want an address/prefix-length such as 10.0.0.0/8", entry)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, normalizePrefix(p))
	}
	return out, nil
}

func normalizePrefixes(ps []netip.Prefix) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(ps))
	for _, p := range ps {
		if p.IsValid() {
			out = append(out, normalizePrefix(p))
		}
	}
	return out
}

// normalizePrefix masks p and rewrites an IPv4-mapped IPv6 prefix (::ffff:a.b.c.d/96+n) as a.b.c.d/n, because
// check compares unmapped addresses and an IPv6 prefix never contains an IPv4 address.
func normalizePrefix(p netip.Prefix) netip.Prefix {
	if a := p.Addr(); a.Is4In6() {
		if p.Bits() >= 96 {
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
		}
	}
	return p.Masked()
}
