package server

import "fmt"

// ListenError is a listener that could not be opened at start-up: the
// address is taken, not local, or not allowed. Listener names it as the
// operator knows it ("API", "metrics", "gRPC"), so that the command can
// name the flag that set the address; this package knows no flags.
type ListenError struct {
	// Listener is the listener's name; Err is net.Listen's error, which
	// names the address.
	Listener string
	Err      error
}

// Error reads "metrics listener: listen tcp 127.0.0.1:9464: bind: address
// already in use".
func (e *ListenError) Error() string { return fmt.Sprintf("%s listener: %v", e.Listener, e.Err) }

// Unwrap returns net.Listen's error.
func (e *ListenError) Unwrap() error { return e.Err }
