package webhook

import (
	"net/http"
	"net/netip"
	"reflect"
	"testing"
)

func prefixes(t *testing.T, s string) []netip.Prefix {
	t.Helper()
	ps, err := ParseCIDRs(s)
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

func TestGuardCheck(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		deny, allow string
		addr        string
		want        string // "" = allowed, else the error text
	}{
		{"metadata v4", "", "", "169.254.169.254", "blocked: 169.254.169.254 is link-local (cloud metadata)"},
		{"metadata v4 mapped", "", "", "::ffff:169.254.169.254", "blocked: 169.254.169.254 is link-local (cloud metadata)"},
		{"metadata v6", "", "", "fd00:ec2::254", "blocked: fd00:ec2::254 is a cloud metadata address"},
		{"link-local v4", "", "", "169.254.1.2", "blocked: 169.254.1.2 is link-local"},
		{"link-local v6 with zone", "", "", "fe80::1%eth0", "blocked: fe80::1 is link-local"},
		{"loopback allowed", "", "", "127.0.0.1", ""},
		{"loopback v6 allowed", "", "", "::1", ""},
		{"private allowed", "", "", "10.1.2.3", ""},
		{"public allowed", "", "", "93.184.216.34", ""},
		{"other ULA allowed", "", "", "fd00:ec2::253", ""},
		{"denied", "10.0.0.0/8", "", "10.1.2.3", "blocked: 10.1.2.3 is in denied range 10.0.0.0/8"},
		{"denied mapped", "10.0.0.0/8", "", "::ffff:10.1.2.3", "blocked: 10.1.2.3 is in denied range 10.0.0.0/8"},
		{"denied as mapped prefix", "::ffff:10.0.0.0/104", "", "10.1.2.3", "blocked: 10.1.2.3 is in denied range 10.0.0.0/8"},
		{"denied v6", "fc00::/7", "", "fd12::1", "blocked: fd12::1 is in denied range fc00::/7"},
		{"allow beats deny", "10.0.0.0/8", "10.1.0.0/16", "10.1.2.3", ""},
		{"allow is narrow", "10.0.0.0/8", "10.1.0.0/16", "10.2.0.1", "blocked: 10.2.0.1 is in denied range 10.0.0.0/8"},
		{"allow beats built-in", "", "169.254.169.254", "169.254.169.254", ""},
		{"allow beats built-in mapped", "", "169.254.0.0/16", "::ffff:169.254.9.9", ""},
		{"allow does not reach neighbours", "", "169.254.169.254", "169.254.169.253", "blocked: 169.254.169.253 is link-local"},
		{"unspecified v4", "", "", "0.0.0.0", "blocked: 0.0.0.0 is unspecified (connects to this host)"},
		{"unspecified v4 mapped", "", "", "::ffff:0.0.0.0", "blocked: 0.0.0.0 is unspecified (connects to this host)"},
		{"unspecified v6", "", "", "::", "blocked: :: is unspecified (connects to this host)"},
		{"NAT64 metadata", "", "", "64:ff9b::a9fe:a9fe", "blocked: 64:ff9b::a9fe:a9fe is an IPv6 form of 169.254.169.254, which is link-local (cloud metadata)"},
		{"6to4 metadata", "", "", "2002:a9fe:a9fe::1", "blocked: 2002:a9fe:a9fe::1 is an IPv6 form of 169.254.169.254, which is link-local (cloud metadata)"},
		{"IPv4-compatible metadata", "", "", "::a9fe:a9fe", "blocked: ::a9fe:a9fe is an IPv6 form of 169.254.169.254, which is link-local (cloud metadata)"},
		{"6to4 of a denied range", "127.0.0.0/8", "", "2002:7f00:1::1", "blocked: 2002:7f00:1::1 is an IPv6 form of 127.0.0.1, which is in denied range 127.0.0.0/8"},
		{"NAT64 of a public address allowed", "", "", "64:ff9b::5db8:d822", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newGuard(prefixes(t, tt.deny), prefixes(t, tt.allow))
			err := g.check(netip.MustParseAddr(tt.addr))
			if got := errText(err); got != tt.want {
				t.Errorf("check(%s) = %q, want %q", tt.addr, got, tt.want)
			}
		})
	}
}

func TestGuardControlAddresses(t *testing.T) {
	t.Parallel()
	g := newGuard(nil, nil)
	tests := []struct{ network, address, want string }{
		{"tcp4", "169.254.169.254:80", "blocked: 169.254.169.254 is link-local (cloud metadata)"},
		{"tcp6", "[fe80::1%eth0]:443", "blocked: fe80::1 is link-local"},
		{"tcp6", "[::ffff:169.254.169.254]:80", "blocked: 169.254.169.254 is link-local (cloud metadata)"},
		{"tcp4", "127.0.0.1:8080", ""},
		{"tcp", "not-an-address", `blocked: cannot check dialed address "not-an-address" (tcp)`},
	}
	for _, tt := range tests {
		if got := errText(g.control(tt.network, tt.address, nil)); got != tt.want {
			t.Errorf("control(%s, %s) = %q, want %q", tt.network, tt.address, got, tt.want)
		}
	}
}

// TestSendBlockedMetadata dials the metadata address for real through the client. The guard refuses it in
// Dialer.Control, before connect(2), so no packet leaves and the test needs no network.
func TestSendBlockedMetadata(t *testing.T) {
	t.Parallel()
	client := New(Options{})
	for _, url := range []string{
		"http://169.254.169.254/latest/meta-data/",
		"http://[::ffff:169.254.169.254]/latest/meta-data/",
	} {
		res := client.Send(t.Context(), newRequest(url))
		want := "blocked: 169.254.169.254 is link-local (cloud metadata)"
		if res.Outcome != OutcomeTerminal || res.HTTPStatus != 0 || res.Message != want {
			t.Errorf("%s: got %v %d %q, want terminal 0 %q", url, res.Outcome, res.HTTPStatus, res.Message, want)
		}
	}
}

func TestSendDenyCIDRs(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, func(http.ResponseWriter, *http.Request) {})

	denied := New(Options{DenyCIDRs: prefixes(t, "127.0.0.0/8, ::1")})
	res := denied.Send(t.Context(), newRequest(rc.URL))
	if res.Outcome != OutcomeTerminal || res.Message != "blocked: 127.0.0.1 is in denied range 127.0.0.0/8" {
		t.Errorf("denied: got %v %q", res.Outcome, res.Message)
	}
	select {
	case <-rc.got:
		t.Error("blocked request reached the receiver")
	default:
	}

	excepted := New(Options{DenyCIDRs: prefixes(t, "127.0.0.0/8"), AllowCIDRs: prefixes(t, "127.0.0.1/32")})
	if res := excepted.Send(t.Context(), newRequest(rc.URL)); res.Outcome != OutcomeSuccess {
		t.Errorf("allowed by exception: got %v %q", res.Outcome, res.Message)
	}
	rc.next(t)
}

func TestParseCIDRs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    []string
		wantErr string
	}{
		{"", nil, ""},
		{" , ", nil, ""},
		{"10.0.0.0/8", []string{"10.0.0.0/8"}, ""},
		{" 10.1.2.3/8 ,fd00::/8,, 192.168.1.1 , ::1", []string{"10.0.0.0/8", "fd00::/8", "192.168.1.1/32", "::1/128"}, ""},
		{"::ffff:10.0.0.0/104", []string{"10.0.0.0/8"}, ""},
		{"192.168.0.0/16,fe80::/10", []string{"192.168.0.0/16", "fe80::/10"}, ""},
		{"10.0.0.1", []string{"10.0.0.1/32"}, ""},
		{"10.0.0.0/33", nil, `parse CIDR "10.0.0.0/33": want an address/prefix-length such as 10.0.0.0/8`},
		{"10.0.0.0/8,example.com", nil, `parse CIDR "example.com": want an address/prefix-length such as 10.0.0.0/8`},
		{"fe80::1%eth0", nil, `parse CIDR "fe80::1%eth0": want an address/prefix-length such as 10.0.0.0/8`},
	}
	for _, tt := range tests {
		got, err := ParseCIDRs(tt.in)
		if errText(err) != tt.wantErr {
			t.Errorf("ParseCIDRs(%q) error = %q, want %q", tt.in, errText(err), tt.wantErr)
			continue
		}
		var strs []string
		for _, p := range got {
			strs = append(strs, p.String())
		}
		if !reflect.DeepEqual(strs, tt.want) {
			t.Errorf("ParseCIDRs(%q) = %q, want %q", tt.in, strs, tt.want)
		}
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
