package hugepages

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"sync"
	"syscall"
)

const (
	hugePage      = 2 << 20
	madvHugePage  = 14 // MADV_HUGEPAGE
	madvCollapse  = 25 // MADV_COLLAPSE, Linux 6.1
	minMappingLen = 2 * hugePage
)

// collapsed are the huge pages (by address) a pass has already asked the
// kernel to assemble.
var collapsed struct {
	sync.Mutex
	pages map[uintptr]bool
}

// advise marks every private anonymous read-write mapping of at least
// minMappingLen bytes with MADV_HUGEPAGE, on its 2 MiB-aligned interior,
// and returns the bytes marked. Marking only changes how memory touched
// afterwards is backed: the runtime maps a new part of the heap and touches
// it at once, before a pass can mark it. So the huge pages a pass sees for
// the first time it also asks the kernel to assemble now (MADV_COLLAPSE:
// the 4 KiB pages already touched are copied into a 2 MiB one), once.
func advise() (int64, error) {
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return 0, err
	}
	collapsed.Lock()
	defer collapsed.Unlock()
	if collapsed.pages == nil {
		collapsed.pages = map[uintptr]bool{}
	}
	var marked int64
	sc := bufio.NewScanner(bytes.NewReader(maps))
	for sc.Scan() {
		start, end, ok := anonymousRW(sc.Bytes())
		if !ok || end-start < minMappingLen {
			continue
		}
		beg, fin := (start+hugePage-1)&^(hugePage-1), end&^(hugePage-1)
		if beg >= fin {
			continue
		}
		if err := madvise(beg, fin, madvHugePage); err != nil {
			return marked, err
		}
		marked += int64(fin - beg)
		collapseNew(beg, fin)
	}
	return marked, sc.Err()
}

// collapseNew asks the kernel to assemble the huge pages of [beg, fin) not
// asked for before, a run of them at a time. It is best effort: without a
// free huge page, or on a kernel before 6.1, the memory keeps its pages.
func collapseNew(beg, fin uintptr) {
	run := beg
	for p := beg; p <= fin; p += hugePage {
		if p < fin && !collapsed.pages[p] {
			collapsed.pages[p] = true
			continue
		}
		if run < p {
			madvise(run, p, madvCollapse)
		}
		run = p + hugePage
	}
}

func madvise(beg, fin uintptr, advice int) error {
	if _, _, e := syscall.Syscall(syscall.SYS_MADVISE, beg, fin-beg, uintptr(advice)); e != 0 {
		return e
	}
	return nil
}

// anonymousRW parses a line of /proc/self/maps ("start-end perms offset
// dev inode [path]") and reports the range of a private read-write
// mapping of no file.
func anonymousRW(line []byte) (start, end uintptr, ok bool) {
	f := bytes.Fields(line)
	if len(f) < 5 || len(f) > 6 || string(f[1]) != "rw-p" || string(f[4]) != "0" {
		return 0, 0, false
	}
	if len(f) == 6 && string(f[5]) != "[heap]" {
		return 0, 0, false // a stack, vdso or the like
	}
	lo, hi, found := bytes.Cut(f[0], []byte("-"))
	if !found {
		return 0, 0, false
	}
	s, err1 := strconv.ParseUint(string(lo), 16, 64)
	e, err2 := strconv.ParseUint(string(hi), 16, 64)
	if err1 != nil || err2 != nil || e <= s {
		return 0, 0, false
	}
	return uintptr(s), uintptr(e), true
}
