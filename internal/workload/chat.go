package workload

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"time"
)

// Turn is one message a client sends in a conversation, after which it
// waits for the reply.
type Turn struct {
	// Think is the pause before the turn is sent, after the previous reply
	// (or the session's start).
	Think time.Duration
	// Role is the message's role; empty means "user" (agents send "tool").
	Role string
	// User is the message text, unless Blocks is set.
	User string
	// Blocks, when set, describe the text instead: block ids of
	// BlockTokens tokens each (see BlockText), Tokens tokens in all. Text
	// is made when the turn is sent, so that a long trace need not be held
	// in memory.
	Blocks      []uint64
	BlockTokens int
	Tokens      int
	// MaxTokens is the requested output length.
	MaxTokens int
	// Heavy marks a turn carrying a long document.
	Heavy bool
}

// Text returns the turn's message text.
func (t *Turn) Text() string {
	if t.Blocks == nil {
		return t.User
	}
	return BlocksText(t.Blocks, t.BlockTokens, t.Tokens)
}

// MessageRole returns the turn's role, "user" by default.
func (t *Turn) MessageRole() string {
	if t.Role == "" {
		return "user"
	}
	return t.Role
}

// Session is one user's conversation: a system prompt and turns sent one
// after another, each with every earlier message and reply before it.
type Session struct {
	// ID is the session key the client sends (X-Session-ID).
	ID string
	// Start is when the first turn may be sent, from the start of the run.
	Start time.Duration
	// System is the system prompt, shared with other sessions of its group.
	System string
	// Turns are the user's messages in order.
	Turns []Turn
	// Model is the model the session's requests name; empty: the fleet's
	// one model (AssignModels sets it for a fleet of several).
	Model string
	// Adapter, when set, is the LoRA adapter of the model the session's
	// requests name instead (the lora workload).
	Adapter string
}

// ChatConfig shapes a multi-turn chat workload. Lengths are in bytes of
// text (about four per token); times are in model time.
type ChatConfig struct {
	// Sessions is the number of conversations.
	Sessions int
	// Span is the window over which sessions start (uniformly).
	Span time.Duration
	// Turns is the number of turns per conversation.
	Turns int
	// SystemPrompts is the number of distinct shared system prompts; each
	// session draws one (Zipf-like: the first is the most popular).
	SystemPrompts int
	// SystemBytes is the length of each system prompt.
	SystemBytes int
	// UserBytes is the typical length of a light user message.
	UserBytes int
	// HeavyFraction of turns carry a document of DocumentBytes.
	HeavyFraction float64
	// DocumentBytes is the length of a heavy turn's document.
	DocumentBytes int
	// LightTokens and HeavyTokens are the output lengths of light and heavy
	// turns.
	LightTokens, HeavyTokens int
	// Think is the mean pause between a reply and the next turn
	// (exponentially distributed).
	Think time.Duration
	// LongFraction of the sessions ask for LongTokens of output on every
	// turn: the users who want essays and code, whose streams hold a batch
	// slot for seconds.
	LongFraction float64
	LongTokens   int
}

// DemoChat is the workload of `kvroute demo`: chats under four shared system
// prompts, mostly short questions and answers, with one turn in ten carrying
// a long document to summarise.
func DemoChat() ChatConfig {
	return ChatConfig{
		Sessions:      200,
		Span:          45 * time.Second,
		Turns:         6,
		SystemPrompts: 4,
		SystemBytes:   8_000,
		UserBytes:     300,
		HeavyFraction: 0.1,
		DocumentBytes: 48_000,
		LightTokens:   80,
		HeavyTokens:   250,
		Think:         15 * time.Second,
	}
}

// SmallChat is chat sized for real inference servers on CPUs (llama.cpp's
// llama-server with a small model on a core each): the same shape as
// DemoChat, shared system prompts and growing conversations, at a few
// hundred to about two thousand tokens a prompt rather than ten thousand,
// with short replies and no documents, so that a run takes minutes.
func SmallChat() ChatConfig {
	return ChatConfig{
		Sessions:      24,
		Span:          60 * time.Second,
		Turns:         4,
		SystemPrompts: 3,
		SystemBytes:   2_400,
		UserBytes:     300,
		LightTokens:   24,
		HeavyTokens:   24,
		Think:         5 * time.Second,
	}
}

// LongChat is chat where users outnumber an engine's batch slots and one
// in four asks for long replies: DemoChat's conversations with short
// pauses, 1,000 tokens a turn for the long-reply users. Prefix affinity and
// load pull apart here: a server holding a conversation's cache may have
// every slot busy streaming.
func LongChat() ChatConfig {
	c := DemoChat()
	c.Think = 3 * time.Second
	c.LongFraction, c.LongTokens = 0.25, 1000
	return c
}

// Chat generates the sessions of cfg, deterministically for seed, sorted by
// start time.
func Chat(cfg ChatConfig, seed uint64) []Session {
	rng := rand.New(rand.NewPCG(seed, 0x636861742d776c))
	systems := make([]string, max(cfg.SystemPrompts, 1))
	for i := range systems {
		systems[i] = fmt.Sprintf("You are assistant %d. ", i) + Text(rng, cfg.SystemBytes)
	}
	// Popularity of system prompt k is proportional to 1/(k+1).
	weights := make([]float64, len(systems))
	var sum float64
	for k := range weights {
		weights[k] = 1 / float64(k+1)
		sum += weights[k]
	}
	drawSystem := func() string {
		x := rng.Float64() * sum
		for k, w := range weights {
			if x < w {
				return systems[k]
			}
			x -= w
		}
		return systems[len(systems)-1]
	}
	sessions := make([]Session, cfg.Sessions)
	for i := range sessions {
		s := Session{
			ID:     fmt.Sprintf("session-%04d", i),
			Start:  time.Duration(rng.Float64() * float64(cfg.Span)),
			System: drawSystem(),
		}
		light := cfg.LightTokens
		// Drawn only when asked for, so that other chats' sessions stay
		// what they were for their seed.
		if cfg.LongFraction > 0 && rng.Float64() < cfg.LongFraction {
			light = cfg.LongTokens
		}
		for t := range cfg.Turns {
			turn := Turn{MaxTokens: light}
			if t > 0 {
				turn.Think = time.Duration(rng.ExpFloat64() * float64(cfg.Think))
			}
			// Light messages vary from a third to twice the typical length.
			n := int(float64(cfg.UserBytes) * math.Exp(rng.NormFloat64()*0.5))
			turn.User = Text(rng, max(n, 8))
			if rng.Float64() < cfg.HeavyFraction {
				turn.Heavy = true
				turn.User = "Summarise this document:\n" + Text(rng, cfg.DocumentBytes) + "\n" + turn.User
				turn.MaxTokens = max(cfg.HeavyTokens, light)
			}
			s.Turns = append(s.Turns, turn)
		}
		sessions[i] = s
	}
	sort.SliceStable(sessions, func(a, b int) bool { return sessions[a].Start < sessions[b].Start })
	return sessions
}
