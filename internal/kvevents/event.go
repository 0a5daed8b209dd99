// Package kvevents follows what each backend really holds in its KV cache,
// from the engines' own KV events (vLLM's kv_events: BlockStored,
// BlockRemoved, AllBlocksCleared, msgpack batches over a ZMQ PUB socket,
// with a replay socket for missed batches), and matches a prompt's token
// ids against it, block by block.
//
// The engines name blocks by a hash chain whose function and seed the
// router cannot reproduce in general (vLLM's sha256 over CBOR or a builtin
// hash with a per-process seed). BlockStored carries each block's token
// ids, so the store re-hashes them with a chain of its own (TokenChain) and
// keeps, per engine hash, the chain hash it stands for: a prompt's token
// ids, hashed the same way, match block by block whatever the engine's
// function. The simulator, whose engines and router share one process,
// names blocks by the engine's own hash instead (KeyEngine).
package kvevents

// Media are the storage tiers vLLM's events name. An event without a
// medium (vLLM before CPU offloading) is on the GPU.
const (
	MediumGPU = "GPU"
	MediumCPU = "CPU"
)

// Kind is what an event says.
type Kind uint8

// The kinds of vLLM's KV cache events.
const (
	// BlockStored: blocks became findable in the prefix cache.
	BlockStored Kind = iota + 1
	// BlockRemoved: blocks were evicted.
	BlockRemoved
	// AllBlocksCleared: the whole cache was dropped (a prefix cache reset).
	AllBlocksCleared
)

// Tags are the event type names on the wire (msgspec's default tag: the
// class name).
var tags = [...]string{BlockStored: "BlockStored", BlockRemoved: "BlockRemoved", AllBlocksCleared: "AllBlocksCleared"}

func (k Kind) String() string {
	if int(k) < len(tags) && tags[k] != "" {
		return tags[k]
	}
	return "unknown"
}

// Event is one KV cache event. Fields a kind does not carry are zero.
type Event struct {
	Kind Kind
	// Hashes are the blocks' hashes, in sequence order. A hash sent as
	// bytes (vLLM's default since it hashes with sha256) is read as its
	// last eight bytes, big-endian: what vLLM sends as an int when
	// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES is set.
	Hashes []uint64
	// Parent is the hash of the block before the first, when HasParent.
	Parent    uint64
	HasParent bool
	// Tokens are the token ids of the stored blocks, BlockSize per block.
	Tokens    []int32
	BlockSize int
	// LoRAID and LoRAName name the adapter the blocks were computed with
	// (zero: the base model).
	LoRAID   int
	LoRAName string
	// Medium is where the blocks are (MediumGPU when the event says none).
	Medium string
	// Group is the KV cache group (hybrid models have several); 0 when the
	// event says none.
	Group int
}

// Batch is one published message: the events of one engine step.
type Batch struct {
	// TS is when the engine published it, in seconds since the Unix epoch.
	TS     float64
	Events []Event
	// DPRank is the data-parallel rank that published it, when HasDPRank.
	DPRank    int
	HasDPRank bool
}
