package llamacpp

import "syscall"

// dieWithParent makes the kernel kill the server if the process that
// started it dies, so that a crashed or killed test leaves no server behind.
func dieWithParent() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
