// Package progress draws the progress bars of `kvroute bench` and `kvroute
// sim` on the terminal.
package progress

import (
	"fmt"
	"io"
	"time"

	"github.com/schollz/progressbar/v3"
)

// Bar is the bar a run shows on w while it plays n requests through policy:
// one line per policy, the same in bench and sim. Like any
// progressbar.ProgressBar it is safe for concurrent use.
func Bar(w io.Writer, n int, policy string) *progressbar.ProgressBar {
	return progressbar.NewOptions(n,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(fmt.Sprintf("%-20s", policy)),
		progressbar.OptionShowCount(),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(200*time.Millisecond),
		progressbar.OptionOnCompletion(func() { fmt.Fprintln(w) }),
	)
}
