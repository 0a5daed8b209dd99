package policies

import (
	"strings"

	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/router/kvroute"
)

// SplitOptions tune the prefill/decode splitters: the rules of thumb's
// thresholds and the priced decision's engine facts.
type SplitOptions struct {
	Rules router.SplitOptions
	Price kvroute.Split
}

// DefaultSplitter is the splitter --pd-split names by default.
const DefaultSplitter = "priced"

// SplitterNames lists the splitters NewSplitter knows, the default first.
func SplitterNames() []string { return append([]string{"priced"}, router.SplitRules()...) }

// NewSplitter returns the prefill/decode splitter called name: "priced"
// (kvroute's decision) or one of the rules of thumb (router.SplitRules).
func NewSplitter(name string, o SplitOptions) (router.Splitter, error) {
	if strings.TrimSpace(name) == "priced" {
		s := o.Price
		return &s, nil
	}
	return router.NewSplitRule(strings.TrimSpace(name), o.Rules)
}
