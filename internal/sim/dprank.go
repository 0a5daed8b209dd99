package sim

import "fmt"

// serverName is the name of engine i: gpuI, or with data-parallel ranks
// gpuS/dpR, rank R of server S.
func (c *Config) serverName(i int) string {
	if c.DataParallel > 1 {
		return fmt.Sprintf("gpu%d/dp%d", i/c.DataParallel, i%c.DataParallel)
	}
	return fmt.Sprintf("gpu%d", i)
}
