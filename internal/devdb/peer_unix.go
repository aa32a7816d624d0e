//go:build unix

package devdb

import (
	"errors"
	"net"
	"syscall"
)

// peerClosed reports whether the peer of c closed its side or reset the connection: a non-blocking
// MSG_PEEK read returns 0 bytes or ECONNRESET. It returns false when data waits, when nothing does (EAGAIN),
// and when c is not a TCP connection. It consumes nothing.
func peerClosed(c net.Conn) bool {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return false
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	var buf [1]byte
	_ = raw.Read(func(fd uintptr) bool {
		n, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		closed = (n == 0 && err == nil) || errors.Is(err, syscall.ECONNRESET)
		return true // never wait for the socket to become readable
	})
	return closed
}
