package cluster

import (
	"errors"
	"net"
)

// errAddrInUse tells that a process lost the race for a port that FreePort
// handed out; starting again with new ports is the cure.
var errAddrInUse = errors.New("address already in use")

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// FreeDNSPort returns a port on 127.0.0.1 that was free a moment ago for both
// TCP and UDP, as a DNS server needs.
func FreeDNSPort() (int, error) {
	var err error
	for range 20 {
		var l net.Listener
		l, err = net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		var pc net.PacketConn
		pc, err = net.ListenPacket("udp", l.Addr().String())
		l.Close()
		if err == nil {
			pc.Close()
			return port, nil
		}
	}
	return 0, err
}
