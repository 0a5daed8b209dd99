package report

import (
	"fmt"
	"html/template"
	"math"
	"strconv"
	"strings"
	"time"
)

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// num formats an SVG coordinate; a non-finite value (which a bug upstream
// could produce) becomes 0 rather than breaking the image.
func num(v float64) string {
	if !finite(v) {
		v = 0
	}
	return strconv.FormatFloat(math.Round(v*10)/10, 'f', -1, 64)
}

func esc(s string) string { return template.HTMLEscapeString(s) }

func truncate(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

func fmtPct(v float64) string {
	if !finite(v) {
		return "—"
	}
	return fmt.Sprintf("%.1f %%", 100*v)
}

func fmtRate(v float64) string {
	switch {
	case !finite(v):
		return "—"
	case v >= 100:
		return fmtThousands(int64(math.Round(v)))
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func fmtDur(d time.Duration) string {
	ms := float64(d) / float64(time.Millisecond)
	switch {
	case ms < 1:
		return fmt.Sprintf("%.2f ms", ms)
	case ms < 10:
		return fmt.Sprintf("%.1f ms", ms)
	case ms < 1000:
		return fmt.Sprintf("%.0f ms", ms)
	case ms < 10_000:
		return fmt.Sprintf("%.2f s", ms/1000)
	case ms < 100_000:
		return fmt.Sprintf("%.1f s", ms/1000)
	}
	return fmt.Sprintf("%.0f s", ms/1000)
}

// msLabel labels a log-axis tick given in milliseconds.
func msLabel(ms float64) string {
	if ms >= 1000 {
		return strconv.FormatFloat(ms/1000, 'g', 3, 64) + " s"
	}
	return strconv.FormatFloat(ms, 'g', 3, 64) + " ms"
}

func fmtThousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteString(",")
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
