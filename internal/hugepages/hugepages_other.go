//go:build !linux

package hugepages

import "errors"

func advise() (int64, error) { return 0, errors.New("no huge page advice on this system") }
