//go:build unix

package server

import (
	"net"
	"testing"

	"github.com/kvroute/kvroute/internal/rawsock"
)

// Client connections are read and written raw under the connection cap
// (on by default) as without it, and not with NetConnIO.
func TestClientConnsRaw(t *testing.T) {
	for _, tt := range []struct {
		name     string
		maxConns int
		raw      bool
	}{
		{name: "capped", maxConns: DefaultMaxConns, raw: true},
		{name: "no cap", raw: true},
		{name: "netconn", maxConns: DefaultMaxConns, raw: false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			if tt.maxConns > 0 {
				ln = limitListener(ln, tt.maxConns)
			}
			ln = openAIErrors(ln, tt.raw)
			client, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			c, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_, isRaw := c.(errorsConn).Conn.(*rawsock.Conn)
			if isRaw != tt.raw {
				t.Fatalf("accepted %T inside errorsConn: raw %v, want %v", c.(errorsConn).Conn, isRaw, tt.raw)
			}
			if _, err := client.Write([]byte("ping")); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 4)
			if n, err := c.Read(buf); err != nil || string(buf[:n]) != "ping" {
				t.Fatalf("read %q, %v", buf[:n], err)
			}
		})
	}
}
