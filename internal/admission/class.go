package admission

import (
	"fmt"
	"strings"
)

// Headers a client sets to choose its class and its fairness flow. The proxy
// reads them (and decides whether to trust them): X-Kvroute-Priority holds a
// class name or number (ParseClass); X-Kvroute-Tenant names the flow that
// fair queueing balances, by default the name of the request's API key.
const (
	HeaderPriority = "X-Kvroute-Priority"
	HeaderTenant   = "X-Kvroute-Tenant"
)

// Class is a request's priority: 0 is the highest. Every waiter of a class
// is admitted before any waiter of a lower class (a higher number). The
// three levels are the Gateway API inference extension's criticalities.
type Class uint8

// The classes, highest first.
const (
	// Critical requests jump every queue and displace Sheddable and
	// Standard waiters from a full queue.
	Critical Class = iota
	// Standard is the class of a request that names none.
	Standard
	// Sheddable requests go last and are the first to be displaced.
	Sheddable
)

// NumClasses is the number of classes: valid classes are 0..NumClasses-1.
const NumClasses = 3

var classNames = [NumClasses]string{"critical", "standard", "sheddable"}

// String is the class's lower-case name, the value of the metrics' class
// label.
func (c Class) String() string { return classNames[c.valid()] }

// valid maps an out-of-range class to Sheddable: a bad value never buys a
// higher priority.
func (c Class) valid() Class {
	if c >= NumClasses {
		return Sheddable
	}
	return c
}

// ParseClass reads a class from a header value: a name ("critical",
// "standard", "sheddable", any case) or its number ("0", "1", "2"). The
// empty string is Standard.
func ParseClass(s string) (Class, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Standard, nil
	}
	for i, name := range classNames {
		if strings.EqualFold(s, name) || s == string(rune('0'+i)) {
			return Class(i), nil
		}
	}
	return Standard, fmt.Errorf("admission: unknown priority class %q (want critical, standard, sheddable or 0..%d)", s, NumClasses-1)
}
