package hugepages

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unsafe"
)

func TestAnonymousRW(t *testing.T) {
	tests := []struct {
		name, line string
		want       bool
		start, end uintptr
	}{
		{"heap arena", "c000000000-c004000000 rw-p 00000000 00:00 0 ", true, 0xc000000000, 0xc004000000},
		{"brk heap", "01c8e000-01caf000 rw-p 00000000 00:00 0                                  [heap]", true, 0x01c8e000, 0x01caf000},
		{"file", "7f00-8f00 rw-p 00000000 08:01 1234 /usr/lib/libc.so.6", false, 0, 0},
		{"stack", "7ffd0000-7ffe0000 rw-p 00000000 00:00 0                          [stack]", false, 0, 0},
		{"read-only", "c000000000-c004000000 r--p 00000000 00:00 0", false, 0, 0},
		{"reserved", "c004000000-c008000000 ---p 00000000 00:00 0", false, 0, 0},
		{"shared", "c000000000-c004000000 rw-s 00000000 00:01 7 ", false, 0, 0},
		{"garbage", "not a mapping", false, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, e, ok := anonymousRW([]byte(tt.line))
			if ok != tt.want || ok && (s != tt.start || e != tt.end) {
				t.Errorf("anonymousRW(%q) = %x, %x, %v", tt.line, s, e, ok)
			}
		})
	}
}

// After Keep, the heap's mapping holding a large slice carries the kernel's
// huge page mark ("hg" in its VmFlags).
func TestKeepMarksTheHeap(t *testing.T) {
	big := make([]byte, 64<<20)
	marked, stop := Keep(0)
	defer stop()
	if _, err := advise(); errors.Is(err, syscall.EINVAL) {
		t.Skip("this kernel has no transparent huge pages")
	}
	if marked < 2<<20 {
		t.Fatalf("marked %d bytes", marked)
	}
	p := uintptr(unsafe.Pointer(&big[0]))
	flags := vmFlags(t, p)
	if !strings.Contains(" "+flags+" ", " hg ") {
		t.Errorf("the slice's mapping has VmFlags %q, no hg", flags)
	}
}

// vmFlags returns the VmFlags of the mapping holding address p, from
// /proc/self/smaps.
func vmFlags(t *testing.T, p uintptr) string {
	t.Helper()
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Skip(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(smaps))
	in := false
	for sc.Scan() {
		line := sc.Text()
		if lo, rest, ok := strings.Cut(line, "-"); ok && !strings.Contains(lo, ":") && !strings.HasSuffix(lo, " ") {
			hi, _, _ := strings.Cut(rest, " ")
			s, err1 := strconv.ParseUint(lo, 16, 64)
			e, err2 := strconv.ParseUint(hi, 16, 64)
			if err1 == nil && err2 == nil {
				in = uintptr(s) <= p && p < uintptr(e)
				continue
			}
		}
		if flags, ok := strings.CutPrefix(line, "VmFlags:"); ok && in {
			return strings.TrimSpace(flags)
		}
	}
	t.Fatalf("no mapping holds %x", p)
	return ""
}
