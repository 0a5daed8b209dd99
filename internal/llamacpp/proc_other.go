//go:build !linux

package llamacpp

import "syscall"

// dieWithParent has no portable equivalent outside Linux: servers are
// killed by Close and by the context only.
func dieWithParent() *syscall.SysProcAttr { return nil }
