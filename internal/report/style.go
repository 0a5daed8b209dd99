package report

import (
	"fmt"
	"math"

	"github.com/kvroute/kvroute/internal/results"
)

// Colours are fixed so a policy looks the same in every chart and in every
// report: kvroute gets the strongest one, the others a muted palette in the
// order they were run.
const kvrouteColor = "#c81d25"

var policyPalette = []string{
	"#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2",
	"#9c755f", "#e0b92e", "#ff9da7", "#8c8c8c", "#17becf",
}

// backendRamp is sampled evenly (viridis, dark to light without the pale
// yellow end), so any number of backends gets distinguishable lines.
var backendRamp = [][3]float64{
	{68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {190, 210, 40},
}

type policyStyle struct {
	Name    string
	Color   string
	KVRoute bool
}

func (s policyStyle) stroke() string {
	if s.KVRoute {
		return "2.75"
	}
	return "1.75"
}

func isKVRoute(policy string) bool { return policy == "kvroute" }

func policyStyles(runs []results.Run) []policyStyle {
	byName := map[string]string{}
	next := 0
	styles := make([]policyStyle, len(runs))
	for i, run := range runs {
		name := runName(run)
		color, ok := byName[name]
		switch {
		case ok:
		case isKVRoute(name):
			color = kvrouteColor
		default:
			color = policyPalette[next%len(policyPalette)]
			next++
		}
		byName[name] = color
		styles[i] = policyStyle{Name: name, Color: color, KVRoute: isKVRoute(name)}
	}
	return styles
}

func runName(run results.Run) string {
	switch {
	case run.Policy != "":
		return run.Policy
	case run.Summary.Name != "":
		return run.Summary.Name
	}
	return "(unnamed)"
}

func backendColor(i, n int) string {
	t := 0.0
	if n > 1 {
		t = float64(i) / float64(n-1)
	}
	seg := t * float64(len(backendRamp)-1)
	k := min(int(seg), len(backendRamp)-2)
	f := seg - float64(k)
	a, b := backendRamp[k], backendRamp[k+1]
	c := func(j int) int { return int(math.Round(a[j] + f*(b[j]-a[j]))) }
	return fmt.Sprintf("#%02x%02x%02x", c(0), c(1), c(2))
}
