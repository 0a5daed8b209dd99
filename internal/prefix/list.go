package prefix

// The per-backend lists of an Index's entries, in a slab with a free list;
// each entry sits in one LRU per tier (index.go).

// inAny reports whether the entry is in any tier.
func (n *node) inAny() bool {
	for _, s := range n.slot {
		if s != notIn {
			return true
		}
	}
	return false
}

func (l *list) alloc(b int32) int32 {
	nd := node{b: b, prev: nilNode, next: nilNode}
	for t := range nd.slot {
		nd.slot[t] = notIn
	}
	if l.free != nilNode {
		n := l.free
		l.free = l.nodes[n].next
		l.nodes[n] = nd
		return n
	}
	l.nodes = append(l.nodes, nd)
	return int32(len(l.nodes) - 1)
}

func (l *list) release(n int32) {
	l.nodes[n] = node{b: -1, next: l.free, prev: nilNode}
	l.free = n
}

// newer returns the nearest entry to n toward the head that is in tier t,
// or nilNode.
func (l *list) newer(n int32, t int) int32 {
	for n = l.nodes[n].prev; n != nilNode && l.nodes[n].slot[t] == notIn; n = l.nodes[n].prev {
	}
	return n
}

func (l *list) pushHead(n int32) {
	l.nodes[n].prev, l.nodes[n].next = nilNode, l.head
	if l.head != nilNode {
		l.nodes[l.head].prev = n
	}
	l.head = n
}

func (l *list) unlink(n int32) {
	p, nx := l.nodes[n].prev, l.nodes[n].next
	if p != nilNode {
		l.nodes[p].next = nx
	} else {
		l.head = nx
	}
	if nx != nilNode {
		l.nodes[nx].prev = p
	}
}
