package frontbench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// clockTicks is USER_HZ, the unit of /proc/PID/stat's CPU times: 100 on
// every Linux architecture Go runs on.
const clockTicks = 100

// cpuSeconds returns the user and system CPU time, in seconds, of pid and
// every process below it (nginx's worker is its master's child).
func cpuSeconds(pid int) (float64, error) {
	ticks := 0
	for _, p := range processTree(pid) {
		f, err := statFields(p)
		if err != nil {
			if p == pid {
				return 0, err
			}
			continue // a child that just exited
		}
		u, _ := strconv.Atoi(f[11]) // utime, field 14
		s, _ := strconv.Atoi(f[12]) // stime, field 15
		ticks += u + s
	}
	return float64(ticks) / clockTicks, nil
}

// statFields returns the fields of /proc/PID/stat after the command name:
// state is [0], the parent's PID [1].
func statFields(pid int) ([]string, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return nil, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')') // the name may hold spaces and parentheses
	if i < 0 {
		return nil, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return nil, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	return f, nil
}

// processTree returns pid and its descendants.
func processTree(pid int) []int {
	children := map[int][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f, err := statFields(p); err == nil {
			ppid, _ := strconv.Atoi(f[1])
			children[ppid] = append(children[ppid], p)
		}
	}
	tree := []int{pid}
	for i := 0; i < len(tree); i++ {
		tree = append(tree, children[tree[i]]...)
	}
	return tree
}

// pinTree binds every thread of pid and of its descendants to cpu.
func pinTree(pid, cpu int) error {
	for _, p := range processTree(pid) {
		tasks, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(p), "task"))
		if err != nil {
			continue
		}
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				continue
			}
			if err := setAffinity(tid, cpu); err != nil {
				return fmt.Errorf("pin %d to CPU %d: %w", tid, cpu, err)
			}
		}
	}
	return nil
}

// setAffinity is sched_setaffinity(tid, {cpu}); the standard library's
// syscall package has the call's number but no wrapper.
func setAffinity(tid, cpu int) error {
	var mask [16]uint64 // 1024 CPUs, the kernel's cpu_set_t
	mask[cpu/64] |= 1 << (cpu % 64)
	_, _, e := syscall.RawSyscall(syscall.SYS_SCHED_SETAFFINITY, uintptr(tid), unsafe.Sizeof(mask), uintptr(unsafe.Pointer(&mask)))
	if e != 0 {
		return e
	}
	return nil
}

// raiseFileLimit lifts this process's open-file limit to its hard limit,
// and with it its children's: 2,000 streams through a front are 4,000
// sockets there.
func raiseFileLimit() (uint64, error) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, err
	}
	l.Cur = l.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, err
	}
	return l.Cur, nil
}

// child is a process this benchmark started: a role of this binary or a
// kvroute serve.
type child struct {
	name string
	cmd  *exec.Cmd
	out  *bufio.Reader // its stdout, for the roles' announcements
	err  *limitedWriter
}

// startChild starts bin with args, bound to cpu (-1: anywhere) through
// taskset so that every thread the Go runtime makes later inherits it and
// GOMAXPROCS is read from it. The child is killed if this process dies, and
// signalled SIGTERM when ctx ends.
func startChild(ctx context.Context, name string, cpu int, bin string, args ...string) (*child, error) {
	if cpu >= 0 {
		if ts, err := exec.LookPath("taskset"); err == nil {
			args = append([]string{"-c", strconv.Itoa(cpu), bin}, args...)
			bin = ts
		}
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	c := &child{name: name, cmd: cmd, out: bufio.NewReader(stdout), err: &limitedWriter{n: 8 << 10}}
	cmd.Stderr = c.err
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return c, nil
}

// line reads the next line the child printed, waiting at most wait.
func (c *child) line(wait time.Duration) (string, error) {
	type got struct {
		s   string
		err error
	}
	ch := make(chan got, 1)
	go func() {
		s, err := c.out.ReadString('\n')
		ch <- got{strings.TrimSpace(s), err}
	}()
	select {
	case g := <-ch:
		if g.err != nil {
			return "", fmt.Errorf("%s: %w%s", c.name, g.err, c.stderr())
		}
		return g.s, nil
	case <-time.After(wait):
		return "", fmt.Errorf("%s: nothing printed in %v%s", c.name, wait, c.stderr())
	}
}

// rest reads the child's stdout to its end and waits for it.
func (c *child) rest() ([]byte, error) {
	b, err := io.ReadAll(c.out)
	if werr := c.cmd.Wait(); werr != nil {
		return b, fmt.Errorf("%s: %w%s", c.name, werr, c.stderr())
	}
	return b, err
}

// stop ends the child: SIGTERM, SIGKILL after 5 s.
func (c *child) stop() {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, c.out); _ = c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = c.cmd.Process.Kill()
		<-done
	}
}

func (c *child) stderr() string {
	if s := strings.TrimSpace(c.err.String()); s != "" {
		return "\n" + s
	}
	return ""
}

// limitedWriter keeps the first n bytes written to it.
type limitedWriter struct {
	mu sync.Mutex
	b  strings.Builder
	n  int
}

func (w *limitedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if room := w.n - w.b.Len(); room > 0 {
		w.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (w *limitedWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

var errNotReady = errors.New("not ready")
