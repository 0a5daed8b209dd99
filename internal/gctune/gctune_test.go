package gctune

import (
	"runtime"
	"runtime/metrics"
	"testing"
	"time"
)

const mib = 1 << 20

func TestPercent(t *testing.T) {
	for _, c := range []struct {
		live, floor uint64
		base, want  int
	}{
		{10 * mib, 128 * mib, 100, 1180}, // the goal at the floor
		{64 * mib, 128 * mib, 100, 100},  // live doubled reaches the floor: GOGC as usual
		{100 * mib, 128 * mib, 100, 100}, // past it
		{300 * mib, 128 * mib, 100, 100}, // a live heap above the floor
		{100 * mib, 128 * mib, 20, 28},   // a smaller GOGC still reaches the floor
		{10 * mib, 128 * mib, 2000, 2000},
		{10 * mib, 128 * mib, -1, -1}, // off stays off
		{0, 128 * mib, 100, maxPercent},
		{1, 1 << 62, 100, maxPercent},
	} {
		if got := Percent(c.live, c.floor, c.base); got != c.want {
			t.Errorf("Percent(%d MiB live, %d MiB floor, GOGC %d) = %d, want %d", c.live/mib, c.floor/mib, c.base, got, c.want)
		}
	}
}

func TestBase(t *testing.T) {
	for v, want := range map[string]int{"": 100, "off": -1, "50": 50, "400": 400, "junk": 100} {
		if got := Base(func(string) string { return v }); got != want {
			t.Errorf("GOGC=%q: base %d, want %d", v, got, want)
		}
	}
}

// gogc is the GOGC the runtime applies now.
func gogc() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int(s[0].Value.Uint64())
}

// cycle forces a collection and waits for the tuner to have seen it.
func cycle(t *testing.T, tu *Tuner) {
	t.Helper()
	seen := tu.cycles.Load()
	deadline := time.Now().Add(30 * time.Second)
	for tu.cycles.Load() == seen {
		if time.Now().After(deadline) {
			t.Fatal("the tuner never heard of the cycle")
		}
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
}

var held []byte

// TestTunerFollowsTheLiveHeap runs real cycles: a small live heap gets a goal
// at the floor, a live heap above the floor gets GOGC back, Stop restores it.
func TestTunerFollowsTheLiveHeap(t *testing.T) {
	t.Setenv("GOGC", "100")
	const floor = 16 * mib
	tu := Start(floor)
	if tu == nil {
		t.Fatal("no tuner")
	}
	defer tu.Stop()
	cycle(t, tu)
	live := liveHeap()
	if want := Percent(max(live, minLive), floor, 100); !near(gogc(), want) || gogc() <= 100 {
		t.Fatalf("live heap %d KiB, floor %d MiB: GOGC %d, want about %d", live>>10, floor/mib, gogc(), want)
	}

	held = make([]byte, 2*floor) // no pointers: cheap to keep live
	cycle(t, tu)
	if gogc() != 100 || tu.Percent() != 100 {
		t.Fatalf("live heap %d MiB above the floor: GOGC %d (tuner %d), want 100", liveHeap()/mib, gogc(), tu.Percent())
	}
	held = nil
	cycle(t, tu)
	if gogc() <= 100 {
		t.Fatalf("live heap back to %d KiB: GOGC %d, want the floor's again", liveHeap()>>10, gogc())
	}

	tu.Stop()
	if gogc() != 100 {
		t.Fatalf("after Stop: GOGC %d, want 100", gogc())
	}
}

// near: the tuner moves GOGC only by more than an eighth.
func near(got, want int) bool { return got*8 >= want*7 && got*8 <= want*9 }

func TestOffOrNoFloorDoesNothing(t *testing.T) {
	t.Setenv("GOGC", "off")
	if Start(64*mib) != nil {
		t.Error("a tuner with GOGC=off")
	}
	t.Setenv("GOGC", "")
	if Start(0) != nil {
		t.Error("a tuner without a floor")
	}
	var tu *Tuner
	tu.Stop() // a nil tuner stops as nothing
}
