package llmrouters

import (
	"container/heap"
	"strings"
	"sync"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
)

// SGLangCacheAware is the cache-aware policy of SGLang's router. It keeps an
// approximate radix tree of the request text (characters, not tokens) sent
// to each worker. If the load is imbalanced, that is the largest number of
// requests in flight exceeds the smallest by more than BalanceAbsThreshold
// and is more than BalanceRelThreshold times it, the request goes to the
// least loaded worker ("imbalance"); otherwise to the worker with the longest
// prefix match if the match covers more than CacheThreshold of the prompt
// ("prefix"); otherwise to the worker with the smallest tree, the most free
// cache by SGLang's reckoning, least loaded among equal trees ("low-match").
// Either way the text is inserted under the chosen worker.
//
// Differences from SGLang: the tree counts bytes rather than Unicode
// characters; in-flight requests are the router's own counts (SGLang's
// running queue is the same count); and a worker's tree is trimmed when an
// insertion takes it above MaxTreeChars, down to 90 % of it, instead of by a
// timer every 60 s, which keeps the policy deterministic and its memory
// bounded between timer ticks.
type SGLangCacheAware struct {
	cfg  SGLangConfig
	rand *router.Rand

	mu      sync.Mutex
	tree    charTree
	matched []int // scratch, by backend index
}

// SGLangConfig tunes sglang-cache-aware. Zero values take the defaults of
// SGLang's original router (newer releases default to 0.3, 64 and 1.5).
type SGLangConfig struct {
	// CacheThreshold is the prefix match ratio (matched characters / prompt
	// characters) above which the best-matching worker is chosen (default 0.5).
	CacheThreshold float64
	// BalanceAbsThreshold and BalanceRelThreshold define imbalance: max −
	// min in-flight requests > BalanceAbsThreshold (default 32) and max >
	// BalanceRelThreshold × min (default 1.1).
	BalanceAbsThreshold int
	BalanceRelThreshold float64
	// MaxTreeChars bounds each worker's tree in characters (default 2^24).
	MaxTreeChars int
}

func (c SGLangConfig) withDefaults() SGLangConfig {
	if c.CacheThreshold <= 0 {
		c.CacheThreshold = 0.5
	}
	if c.BalanceAbsThreshold <= 0 {
		c.BalanceAbsThreshold = 32
	}
	if c.BalanceRelThreshold <= 0 {
		c.BalanceRelThreshold = 1.1
	}
	if c.MaxTreeChars <= 0 {
		c.MaxTreeChars = 1 << 24
	}
	return c
}

// NewSGLangCacheAware returns the policy tuned by peers.SGLang; seed 0
// picks a random seed.
func NewSGLangCacheAware(seed uint64, peers Config) *SGLangCacheAware {
	return &SGLangCacheAware{
		cfg:  peers.SGLang.withDefaults(),
		rand: router.NewRand(seed),
		tree: charTree{root: &charNode{}},
	}
}

// Name implements Policy.
func (*SGLangCacheAware) Name() string { return "sglang-cache-aware" }

// Pick implements Policy.
func (p *SGLangCacheAware) Pick(req *router.Request, cands []*fleet.Backend) (router.Decision, error) {
	if len(cands) == 0 {
		return router.Decision{}, router.ErrNoBackend
	}
	lo, hi := cands[0].Load().Requests, int64(0)
	top := 0
	for _, b := range cands {
		n := b.Load().Requests
		lo, hi = min(lo, n), max(hi, n)
		top = max(top, b.Index+1)
	}
	imbalanced := hi-lo > int64(p.cfg.BalanceAbsThreshold) &&
		float64(hi) > p.cfg.BalanceRelThreshold*float64(lo)

	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.matched) < top {
		p.matched = make([]int, top)
	}
	text, tokensPerChar := req.CharText()
	p.tree.match(text, p.matched[:top])
	var chosen *fleet.Backend
	var reason string
	switch {
	case imbalanced:
		chosen, reason = router.LeastLoaded(cands, p.rand.IntN), "imbalance"
	default:
		best := p.best(cands, func(b *fleet.Backend) int { return p.matched[b.Index] })
		if len(text) > 0 && float64(p.matched[best.Index])/float64(len(text)) > p.cfg.CacheThreshold {
			chosen, reason = best, "prefix"
		} else {
			chosen = p.best(cands, func(b *fleet.Backend) int { return -p.tree.sizeOf(b.Index) })
			reason = "low-match"
		}
	}
	matched := p.matched[chosen.Index]
	p.tree.insert(text, int32(chosen.Index))
	if p.tree.sizeOf(chosen.Index) > p.cfg.MaxTreeChars {
		p.tree.evict(int32(chosen.Index), p.cfg.MaxTreeChars*9/10)
	}
	return router.Decide(chosen, reason, min(int(float64(matched)*tokensPerChar), promptTokens(req))), nil
}

// best returns the candidate with the highest value, the least loaded among
// equals, at random among those. Indexes are in range: Pick sized the
// scratch and the tree to every candidate.
func (p *SGLangCacheAware) best(cands []*fleet.Backend, value func(*fleet.Backend) int) *fleet.Backend {
	var best *fleet.Backend
	var bestVal int
	var bestLoad int64
	t := router.NewTies(p.rand)
	for i, b := range cands {
		v, n := value(b), b.Load().Requests
		switch {
		case best == nil || v > bestVal || v == bestVal && n < bestLoad:
			best, bestVal, bestLoad = b, v, n
			t.Reset(i)
		case v == bestVal && n == bestLoad:
			t.Add(i)
			best = cands[t.Best()]
		}
	}
	return best
}

// charTree is SGLang's approximate radix tree: the text sent to every
// worker (tenant), in one tree whose nodes record which tenants hold them and
// when each last used them. A tenant holding a node holds all its ancestors.
// Not safe for concurrent use.
type charTree struct {
	root *charNode
	size []int // characters held, by tenant
	tick uint64
}

type charNode struct {
	label    string // the edge from the parent
	parent   *charNode
	children map[byte]*charNode
	tenants  map[int32]uint64 // tenant → tick of last use
}

// sizeOf returns how many characters tenant holds.
func (t *charTree) sizeOf(tenant int) int {
	if tenant < 0 || tenant >= len(t.size) {
		return 0
	}
	return t.size[tenant]
}

// match sets matched[i] to the length of the longest prefix of text that
// tenant i holds, for every tenant below len(matched).
func (t *charTree) match(text string, matched []int) {
	clear(matched)
	n, depth := t.root, 0
	for len(text) > 0 {
		c := n.children[text[0]]
		if c == nil {
			return
		}
		k := commonPrefix(c.label, text)
		depth += k
		for tenant := range c.tenants {
			if int(tenant) < len(matched) {
				matched[tenant] = depth
			}
		}
		if k < len(c.label) {
			return
		}
		text, n = text[k:], c
	}
}

// insert records that tenant holds text, as its most recently used.
func (t *charTree) insert(text string, tenant int32) {
	if tenant < 0 {
		return
	}
	for int(tenant) >= len(t.size) {
		t.size = append(t.size, 0)
	}
	t.tick++
	n := t.root
	for len(text) > 0 {
		c := n.children[text[0]]
		if c == nil {
			// Clone: the leaf must not keep the whole prompt alive.
			leaf := &charNode{label: strings.Clone(text), parent: n, tenants: map[int32]uint64{tenant: t.tick}}
			if n.children == nil {
				n.children = make(map[byte]*charNode)
			}
			n.children[text[0]] = leaf
			t.size[tenant] += len(text)
			return
		}
		k := commonPrefix(c.label, text)
		if k < len(c.label) {
			c = c.split(k)
		}
		if _, ok := c.tenants[tenant]; !ok {
			t.size[tenant] += len(c.label)
		}
		c.tenants[tenant] = t.tick
		text, n = text[k:], c
	}
}

// split cuts c's edge after k characters and returns the new upper node,
// which every tenant of c holds too.
func (c *charNode) split(k int) *charNode {
	up := &charNode{
		label:    c.label[:k],
		parent:   c.parent,
		children: map[byte]*charNode{c.label[k]: c},
		tenants:  make(map[int32]uint64, len(c.tenants)),
	}
	for tenant, tick := range c.tenants {
		up.tenants[tenant] = tick
	}
	c.parent.children[c.label[0]] = up
	c.label, c.parent = c.label[k:], up
	return up
}

// evict forgets tenant's least recently used leaves until it holds at most
// target characters.
func (t *charTree) evict(tenant int32, target int) {
	var leaves leafHeap
	var walk func(n *charNode)
	walk = func(n *charNode) {
		leaf := true
		for _, c := range n.children {
			if _, ok := c.tenants[tenant]; ok {
				leaf = false
				walk(c)
			}
		}
		if leaf && n != t.root {
			leaves = append(leaves, leafEntry{n, n.tenants[tenant]})
		}
	}
	walk(t.root)
	heap.Init(&leaves)
	for t.size[tenant] > target && leaves.Len() > 0 {
		n := heap.Pop(&leaves).(leafEntry).node
		delete(n.tenants, tenant)
		t.size[tenant] -= len(n.label)
		p := n.parent
		if len(n.tenants) == 0 {
			delete(p.children, n.label[0])
		}
		if p == t.root {
			continue
		}
		leaf := true
		for _, c := range p.children {
			if _, ok := c.tenants[tenant]; ok {
				leaf = false
				break
			}
		}
		if leaf {
			heap.Push(&leaves, leafEntry{p, p.tenants[tenant]})
		}
	}
}

// leafHeap orders a tenant's leaves oldest first. A tenant's leaves never
// share a tick (one insertion touches one path), so the order is total.
type leafHeap []leafEntry

type leafEntry struct {
	node *charNode
	tick uint64
}

func (h leafHeap) Len() int { return len(h) }

func (h leafHeap) Less(i, j int) bool { return h[i].tick < h[j].tick }

func (h leafHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }

func (h *leafHeap) Push(x any) { *h = append(*h, x.(leafEntry)) }

func (h *leafHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// commonPrefix returns the length of the longest common prefix of a and b.
// Whole chunks compare with the runtime's vectorised string equality first:
// prompts share tens of kilobytes.
func commonPrefix(a, b string) int {
	n := min(len(a), len(b))
	i := 0
	for i+64 <= n && a[i:i+64] == b[i:i+64] {
		i += 64
	}
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}

var _ router.FleetWatcher = (*SGLangCacheAware)(nil)

// SetBackends implements FleetWatcher: the tree forgets what it sent to
// backends no longer in the fleet. (It grows with new ones by itself.)
func (p *SGLangCacheAware) SetBackends(backends []*fleet.Backend) {
	in := make(map[int]bool, len(backends))
	for _, b := range backends {
		in[b.Index] = true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, size := range p.tree.size {
		if size > 0 && !in[i] {
			p.tree.evict(int32(i), 0)
		}
	}
}
